"""The app factory every service is built with.

It adds `/healthz`, `/readyz`, `/metrics`, the error handlers that map everything to the
one error body, and the trace middleware: trace context in, `X-Trace-Id` out, the limits
of the HTTP front (header bytes 431, requests in flight 503, body size 413 and body read
time 408, each answered in the error body before the app runs), content-type checks, and
one canonical log line per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services import tracing
from services.errors import (
    ClientClosed,
    HeadersTooLarge,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    UnsupportedMediaType,
    ValidationFailed,
    error_body,
    error_headers,
)
from services.settings import HttpLimits

log = structlog.get_logger("http")

HTTP_REQUESTS = Counter(
    "http_requests_total", "HTTP requests handled", ["service", "route", "method", "status"]
)
HTTP_LATENCY = Histogram(
    "http_request_duration_seconds",
    "HTTP request latency",
    ["service", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

ReadinessCheck = Callable[[], Awaitable[tuple[bool, str]]]
_BODY_METHODS = {"POST", "PUT", "PATCH"}
_PROBES = {"/healthz", "/readyz", "/metrics"}
_MAX_LENGTH_DIGITS = 18  # a Content-Length longer than this is over any body limit
# The `method` label's values: a client may send any token as its method, and a label
# takes every value it is given, so anything else is counted as "other".
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


# How an error is answered: its status and body, given the trace id. The services' own
# shape everywhere (`error_body`), except under the path prefixes an app gives a shape
# of their own (the orchestrator's OpenAI-compatible `/v1/`: services.errors.openai_error).
ErrorFormat = Callable[[ServiceError, str], tuple[int, dict[str, Any]]]


def service_error(exc: ServiceError, trace_id: str) -> tuple[int, dict[str, Any]]:
    return exc.status_code, error_body(exc, trace_id)


def _format_for(formats: Mapping[str, ErrorFormat], path: str) -> ErrorFormat:
    return next((fmt for prefix, fmt in formats.items() if path.startswith(prefix)), service_error)


def _json_response(
    exc: ServiceError, *, close: bool = False, fmt: ErrorFormat = service_error
) -> JSONResponse:
    """The error body; `close` when the request's body may be left unread on the socket."""
    headers = error_headers(exc)
    if close:
        headers["Connection"] = "close"
    status, body = fmt(exc, tracing.current_trace_id())
    return JSONResponse(body, status_code=status, headers=headers)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class TraceMiddleware:
    """Pure ASGI middleware, so streaming responses and disconnects pass through intact.

    A request's body (POST, PUT, PATCH) is read here, whole, before the app runs: at
    most `max_body_bytes` (413, whether the client sent a Content-Length or chunks) within
    `body_read_timeout_s` (408), so a client that declares a body and never sends it
    holds its request for a bounded time. The app then reads the buffered body; later
    `receive()` calls reach the server, so disconnects are still seen.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        service: str,
        limits: HttpLimits,
        error_formats: Mapping[str, ErrorFormat] | None = None,
    ) -> None:
        self.app = app
        self.service = service
        self.limits = limits
        self.error_formats = error_formats or {}
        self.max_body_bytes = limits.max_body_bytes
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = sum(len(k) + len(v) for k, v in scope["headers"])
        oversized = header_bytes > self.limits.max_header_bytes
        headers = (
            {}
            if oversized  # not even decoded: a fresh trace context, the request refused
            else {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        )
        ctx = tracing.context_from_headers(headers.get("traceparent"), headers.get("x-request-id"))
        token = tracing.activate(ctx)
        fmt = _format_for(self.error_formats, scope.get("path", ""))
        started = time.perf_counter_ns()
        state = {"status": 500, "started": False}
        method = scope["method"]
        counted = not (method == "GET" and scope.get("path") in _PROBES)

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["started"] = True
                extra = [(b"x-trace-id", ctx.trace_id.encode())]
                if ctx.request_id:
                    extra.append((b"x-request-id", ctx.request_id.encode()))
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        if counted and self.in_flight >= self.limits.max_in_flight:
            counted = False
            early: ASGIApp | None = _json_response(
                Overloaded(
                    f"{self.service} has {self.limits.max_in_flight} requests in flight, "
                    "its limit; retry shortly"
                ),
                fmt=fmt,
            )
        elif oversized:
            early = _json_response(
                HeadersTooLarge(
                    f"request headers exceed {self.limits.max_header_bytes} bytes",
                    param="headers",
                ),
                close=True,
                fmt=fmt,
            )
        else:
            early = self._precheck(method, headers, fmt)
        if counted:
            self.in_flight += 1
        try:
            if early is not None:
                await early(scope, receive, send_wrapper)
            elif method in _BODY_METHODS:
                body = await self._read_body(receive)
                await self.app(scope, _replay(body, receive), send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        except _TooLarge:
            await _json_response(
                PayloadTooLarge(f"request body exceeds {self.max_body_bytes} bytes"),
                close=True,
                fmt=fmt,
            )(scope, receive, send_wrapper)
        except _BodyTimeout:
            await _json_response(
                RequestTimeout(
                    f"the request body did not arrive within {self.limits.body_read_timeout_s:g}s"
                ),
                close=True,
                fmt=fmt,
            )(scope, receive, send_wrapper)
        except _Disconnected:
            state["status"] = ClientClosed.status_code  # nobody to answer
        except Exception:  # our bug: log the stack, answer without it
            log.exception("unhandled error", **{"event.action": "error"})
            if not state["started"]:
                await _json_response(ServiceError("internal error"), fmt=fmt)(
                    scope, receive, send_wrapper
                )
        finally:
            if counted:
                self.in_flight -= 1
            route = scope.get("route")
            route_name = getattr(route, "path", None) or "unmatched"
            duration_ns = time.perf_counter_ns() - started
            status = int(state["status"])
            method_label = method if method in _METHODS else "other"
            HTTP_REQUESTS.labels(self.service, route_name, method_label, str(status)).inc()
            HTTP_LATENCY.labels(self.service, route_name).observe(duration_ns / 1e9)
            if route_name not in ("/metrics", "/healthz", "/readyz"):
                log.info(
                    f"{method} {route_name} {status}",
                    **{
                        "event.action": route_name.strip("/").replace("/", ".") or "root",
                        "event.kind": "request",
                        "event.duration": duration_ns,
                        "event.outcome": "success" if status < 400 else "failure",
                        "http.request.method": method,
                        "http.response.status_code": status,
                        "url.path": scope.get("path", "")[:200],
                        "http.request.id": ctx.request_id,
                    },
                )
            tracing.deactivate(token)

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.body_read_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _Disconnected
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise _TooLarge
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            raise _BodyTimeout from None

    def _precheck(self, method: str, headers: dict[str, str], fmt: ErrorFormat) -> ASGIApp | None:
        if method not in _BODY_METHODS:
            return None
        length = headers.get("content-length")
        if length is not None:
            # ASCII digits only: str.isdigit() takes '²', which int() refuses, and int()
            # of a string past 4300 digits raises; either would have been a 500
            if not (length.isascii() and length.isdigit()):
                return _json_response(InvalidRequest("invalid Content-Length header"), fmt=fmt)
            if len(length) > _MAX_LENGTH_DIGITS or int(length) > self.max_body_bytes:
                return _json_response(
                    PayloadTooLarge(f"request body exceeds {self.max_body_bytes} bytes"),
                    close=True,
                    fmt=fmt,
                )
        if not _is_json(headers.get("content-type", "")):
            return _json_response(
                UnsupportedMediaType(
                    "request body must be JSON; send Content-Type: application/json",
                    param="Content-Type",
                ),
                fmt=fmt,
            )
        return None


class _TooLarge(Exception):
    pass


class _BodyTimeout(Exception):
    pass


class _Disconnected(Exception):
    pass


def _replay(body: bytes, receive: Receive) -> Receive:
    """The buffered body as one message, then the server's own `receive`."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _validation_error(exc: RequestValidationError) -> ServiceError:
    errors = exc.errors()
    if not errors:
        return ValidationFailed("invalid request")
    first = errors[0]
    if first.get("type") in ("json_invalid", "json_type"):
        return InvalidRequest("request body is not valid JSON", param="body")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        message = "unknown field"
    elif first.get("type") == "missing":
        message = "field required"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ValidationFailed(f"{param or 'body'}: {message}{more}", param=param)


def create_service_app(
    *,
    name: str,
    version: str = "0.1.0",
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
    readiness: ReadinessCheck | None = None,
    max_body_bytes: int = 1_000_000,
    limits: HttpLimits | None = None,
    api_docs: bool = True,
    error_formats: Mapping[str, ErrorFormat] | None = None,
) -> FastAPI:
    """`limits` (a service's `settings.http_limits()`) bound the HTTP front; without it
    the defaults apply, with `max_body_bytes`. `api_docs`: FastAPI's `/docs` and
    `/redoc` pages (`/openapi.json` is always served); they load their scripts from a
    CDN under no Content-Security-Policy, so a service whose origin holds a page with a
    secret in its storage (the orchestrator's console) goes without them. `error_formats`:
    path prefixes whose errors have a shape of their own (`ErrorFormat`), every error
    under them, the HTTP front's included."""
    formats = dict(error_formats or {})
    docs = {} if api_docs else {"docs_url": None, "redoc_url": None}
    app = FastAPI(title=name, version=version, lifespan=lifespan, **docs)
    app.state.service_name = name

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        if exc.status_code >= 500:
            log.warning(exc.message, **{"error.type": exc.error_type, "error.message": exc.message})
        return _json_response(exc, fmt=_format_for(formats, request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _json_response(_validation_error(exc), fmt=_format_for(formats, request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err: ServiceError = NotFound("no such endpoint")
        elif exc.status_code == 405:
            err = MethodNotAllowed("method not allowed on this endpoint")
        else:
            err = InvalidRequest(str(exc.detail))
            err.status_code = exc.status_code
        response = _json_response(err, fmt=_format_for(formats, request.url.path))
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": name}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        ready, reason = await readiness() if readiness else (True, "ready")
        body: dict[str, Any] = {"ready": ready, "service": name, "reason": reason}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(
        TraceMiddleware,
        service=name,
        limits=limits or HttpLimits(max_body_bytes=max_body_bytes),
        error_formats=formats,
    )
    return app


def sse_event(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class HeldStream(StreamingResponse):
    """A streaming response that calls `release` once it is over, however it ends (the
    tenant's slot of a streamed request is held until its last byte or its client's exit)."""

    def __init__(self, content: Any, release: Callable[[], None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def event_stream(content: AsyncIterator[str], release: Callable[[], None]) -> HeldStream:
    """Server-sent events from `content`, calling `release` once they are over."""
    return HeldStream(
        content, release, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def cancel_on_disconnect(request: Request, work: Any) -> Any:
    """Run the request's work; if the client goes away first, cancel it."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        log.info("client disconnected, work cancelled", **{"event.action": "request.cancelled"})
        return _json_response(
            ClientClosed("the client closed the connection before the answer was ready")
        )
    return task.result()
