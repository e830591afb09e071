"""`Client` and `AsyncClient`: the orchestrator's API in Python, typed with the wire
schemas the services themselves use (services/schemas.py).

- `ask(question, n_plans=5, ...)` -> `ReasonResponse`
- `stream(question, events="steps" | "all")` -> the `/reason` stream's events as they
  come (`StepResult`, or with `events="all"` `RoundStart`, `PlanEvent`, `StepEvent`,
  `RoundEnd`), then the `ReasonResponse`; an `error` event is raised
- `trace(trace_id)` -> `TraceView`

Timeouts follow the request: a question may take its `deadline_s`, and the client waits
that plus `timeout_margin_s` for the answer. A 429 or 503 that carries `Retry-After` is
retried after that many seconds, at most `max_retries` times (each wait logged); no other
failure is retried. Errors are `reason.errors` exceptions, with the error body, the
status and the trace id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from reason.errors import APIError, ConnectionFailed, InvalidRequest, ReasonError, api_error
from services.schemas import (
    STREAM_EVENT_NAMES,
    ErrorBody,
    ReasonOptions,
    ReasonRequest,
    ReasonResponse,
    StepResult,
    StreamError,
    StreamEvent,
    TraceView,
)

log = logging.getLogger("reason.client")

DEFAULT_URL = "http://127.0.0.1:8000"
Event = StreamEvent | StepResult | ReasonResponse
Events = Literal["steps", "all"]
_RETRY_STATUSES = (429, 503)
_EVENT_TYPES = {name: cls for cls, name in STREAM_EVENT_NAMES.items()}


class _Base:
    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        max_retries: int = 2,
        max_retry_wait_s: float = 30.0,
        timeout_margin_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        trace_timeout_s: float = 30.0,
    ) -> None:
        if max_retries < 0 or max_retry_wait_s < 0 or timeout_margin_s < 0:
            raise ValueError("max_retries, max_retry_wait_s and timeout_margin_s are >= 0")
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
        self.timeout_margin_s = timeout_margin_s
        self.connect_timeout_s = connect_timeout_s
        self.trace_timeout_s = trace_timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _request(
        self, question: str, options: ReasonOptions | None, kw: dict[str, Any]
    ) -> ReasonRequest:
        """The request, validated here as the server would: a bad question or option is
        an `InvalidRequest` (validation_error) before anything is sent."""
        merged = {**(options.model_dump(exclude_unset=True) if options else {}), **kw}
        try:
            return ReasonRequest(question=question, options=ReasonOptions(**merged))
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise InvalidRequest(
                f"{param or 'request'}: {first['msg']}", error_type="validation_error", param=param
            ) from None

    def _timeout(self, request: ReasonRequest) -> httpx.Timeout:
        return httpx.Timeout(
            request.options.deadline_s + self.timeout_margin_s, connect=self.connect_timeout_s
        )

    def _retry_wait(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying, or None: only a 429 or 503 the server says to
        retry (Retry-After, in seconds), and only `max_retries` times."""
        if response.status_code not in _RETRY_STATUSES or attempt >= self.max_retries:
            return None
        wait = _retry_after(response)
        if wait is None or wait > self.max_retry_wait_s:
            return None
        log.warning(
            "%s %s answered %s; retrying in %.1fs (retry %d of %d)",
            response.request.method,
            response.request.url.path,
            response.status_code,
            wait,
            attempt + 1,
            self.max_retries,
        )
        return wait

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None  # absent, or an HTTP date (the services send seconds)
    return seconds if seconds >= 0 else None


def _raise_for(response: httpx.Response, content: bytes) -> None:
    if response.status_code < 400:
        return
    try:
        data = json.loads(content)
    except ValueError:
        data = None
    raise api_error(
        response.status_code,
        data,
        trace_id=response.headers.get("x-trace-id"),
        retry_after_s=_retry_after(response),
    )


def _parse(model: Any, response: httpx.Response) -> Any:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise APIError(
            f"the answer is not a {model.__name__}: {exc.errors()[0]['msg']}",
            status=response.status_code,
            trace_id=response.headers.get("x-trace-id"),
        ) from None


class _Frames:
    """Server-sent events, one `event:` and one `data:` line each, as the orchestrator
    frames them (services.app.sse_event). Hand-written rather than a dependency: these
    frames are the server's own, and nothing else of the SSE format is used."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self._name: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> Event | None:
        if line.startswith("event:"):
            self._name = line[6:].strip()
        elif line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        elif not line and self._name is not None:
            name, data = self._name, "\n".join(self._data)
            self._name, self._data = None, []
            return self._event(name, data)
        return None

    def _event(self, name: str, data: str) -> Event | None:
        if name == "result":
            return ReasonResponse.model_validate_json(data)
        if name == "error":
            raise self._error(data)
        if name == "step" and self.events == "steps":
            return StepResult.model_validate_json(data)
        cls = _EVENT_TYPES.get(name)
        return cls.model_validate_json(data) if cls is not None else None  # type: ignore[return-value]

    def _error(self, data: str) -> ReasonError:
        if self.events == "all":
            error = StreamError.model_validate_json(data)
            body = ErrorBody(error=error.error, trace_id=error.trace_id)
            return api_error(error.status, body.model_dump(), retry_after_s=error.retry_after_s)
        return api_error(None, json.loads(data))  # the status went out as 200


def _stream_path(events: Events) -> str:
    return "/reason?events=all" if events == "all" else "/reason"


_STREAM_HEADERS = {"Accept": "text/event-stream"}


class Client(_Base):
    """The orchestrator's API, blocking. A context manager (closes its connections)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(base_url, api_key, **kw)
        self._http = httpx.Client(headers=self._headers, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def ask(self, question: str, options: ReasonOptions | None = None, **kw: Any) -> ReasonResponse:
        """Answer `question`; `kw` are `ReasonOptions` fields (n_plans, verify, ...)."""
        request = self._request(question, options, kw)
        response = self._send("POST", "/reason", request.model_dump(), self._timeout(request))
        return _parse(ReasonResponse, response)

    def stream(
        self,
        question: str,
        options: ReasonOptions | None = None,
        *,
        events: Events = "steps",
        **kw: Any,
    ) -> Iterator[Event]:
        """The work as it happens, then the `ReasonResponse` (the last item)."""
        request = self._request(question, options, kw)
        path, body, timeout = _stream_path(events), request.model_dump(), self._timeout(request)
        for attempt in range(self.max_retries + 1):
            try:
                with self._http.stream(
                    "POST", self._url(path), json=body, headers=_STREAM_HEADERS, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        content = response.read()
                        wait = self._retry_wait(response, attempt)
                        if wait is None:
                            _raise_for(response, content)
                    else:
                        frames = _Frames(events)
                        for line in response.iter_lines():
                            event = frames.feed(line)
                            if event is not None:
                                yield event
                        return
            except httpx.HTTPError as exc:
                raise _connection_failed(self.base_url, exc) from None
            assert wait is not None
            time.sleep(wait)

    def trace(self, trace_id: str) -> TraceView:
        """Every log line of one request, as nested spans (`GET /traces/{trace_id}`)."""
        timeout = httpx.Timeout(self.trace_timeout_s, connect=self.connect_timeout_s)
        response = self._send("GET", f"/traces/{trace_id}", None, timeout)
        return _parse(TraceView, response)

    def _send(
        self, method: str, path: str, body: dict[str, Any] | None, limits: httpx.Timeout
    ) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            try:
                response = self._http.request(method, self._url(path), json=body, timeout=limits)
            except httpx.HTTPError as exc:
                raise _connection_failed(self.base_url, exc) from None
            wait = self._retry_wait(response, attempt)
            if wait is None:
                _raise_for(response, response.content)
                return response
            time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


class AsyncClient(_Base):
    """The orchestrator's API for asyncio. An async context manager."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(base_url, api_key, **kw)
        self._http = httpx.AsyncClient(headers=self._headers, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def ask(
        self, question: str, options: ReasonOptions | None = None, **kw: Any
    ) -> ReasonResponse:
        request = self._request(question, options, kw)
        response = await self._send("POST", "/reason", request.model_dump(), self._timeout(request))
        return _parse(ReasonResponse, response)

    async def stream(
        self,
        question: str,
        options: ReasonOptions | None = None,
        *,
        events: Events = "steps",
        **kw: Any,
    ) -> AsyncIterator[Event]:
        request = self._request(question, options, kw)
        path, body, timeout = _stream_path(events), request.model_dump(), self._timeout(request)
        for attempt in range(self.max_retries + 1):
            try:
                async with self._http.stream(
                    "POST", self._url(path), json=body, headers=_STREAM_HEADERS, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        content = await response.aread()
                        wait = self._retry_wait(response, attempt)
                        if wait is None:
                            _raise_for(response, content)
                    else:
                        frames = _Frames(events)
                        async for line in response.aiter_lines():
                            event = frames.feed(line)
                            if event is not None:
                                yield event
                        return
            except httpx.HTTPError as exc:
                raise _connection_failed(self.base_url, exc) from None
            assert wait is not None
            await asyncio.sleep(wait)

    async def trace(self, trace_id: str) -> TraceView:
        timeout = httpx.Timeout(self.trace_timeout_s, connect=self.connect_timeout_s)
        response = await self._send("GET", f"/traces/{trace_id}", None, timeout)
        return _parse(TraceView, response)

    async def _send(
        self, method: str, path: str, body: dict[str, Any] | None, limits: httpx.Timeout
    ) -> httpx.Response:
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._http.request(
                    method, self._url(path), json=body, timeout=limits
                )
            except httpx.HTTPError as exc:
                raise _connection_failed(self.base_url, exc) from None
            wait = self._retry_wait(response, attempt)
            if wait is None:
                _raise_for(response, response.content)
                return response
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


def _connection_failed(url: str, exc: httpx.HTTPError) -> ConnectionFailed:
    kind = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else "unreachable"
    return ConnectionFailed(f"the orchestrator at {url} is {kind} ({type(exc).__name__})")
