"""Orchestrator service: `POST /reason` (JSON or server-sent events), `POST /tools/{name}/run`,
`GET /traces/{trace_id}` (every log line of one request), the web console at `/`
(`orchestrator/console/`, with `GET /console/config`), and the OpenAI-compatible
`GET /v1/models` and `POST /v1/chat/completions` (orchestrator/openai_api.py).

Each tenant may have `ORCH_TENANT_MAX_IN_FLIGHT` of these requests in flight; past it,
429 with Retry-After. The tenant is the API key's; with no keys configured every client
address is a tenant of its own for this limit (and for the sandbox share), while the
cache stays one namespace, "default". Behind a proxy every client has the proxy's
address: configure API keys there.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal

import httpx
import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse

from orchestrator.cache import Cache, create_cache
from orchestrator.confidence import Calibrators
from orchestrator.console import HEADERS as CONSOLE_HEADERS
from orchestrator.console import INDEX, ConsoleFiles
from orchestrator.limits import TenantCounter
from orchestrator.openai_api import ChatServing, openai_router
from orchestrator.service import ReasonService
from orchestrator.tools import build_registry
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry
from orchestrator.traces import TraceLookupError, TraceReader
from services import tracing
from services.app import cancel_on_disconnect, create_service_app, event_stream, sse_event
from services.errors import (
    DependencyUnavailable,
    NotFound,
    ServiceError,
    TooManyRequests,
    Unauthorized,
    ValidationFailed,
    error_body,
    openai_error,
)
from services.http import ServiceClient
from services.logging import bind_tenant, configure_logging
from services.schemas import (
    ConsoleConfig,
    ModelInfo,
    ReasonOptions,
    ReasonRequest,
    ReasonResponse,
    StepResult,
    StreamError,
    StreamEvent,
    ToolRunRequest,
    ToolRunResult,
    TraceView,
)
from services.settings import OrchestratorSettings
from services.tracing import is_trace_id

log = structlog.get_logger("orchestrator")

# What a /reason stream sends (`?events=`): `steps`, the stream as it always was, or
# `all`, with the rounds and the plans (see `_stream`).
StreamEvents = Literal["steps", "all"]


def create_app(
    settings: OrchestratorSettings | None = None,
    *,
    tools_factory: Callable[
        [OrchestratorSettings, Cache, AsyncExitStack], Awaitable[ToolRegistry]
    ] = build_registry,
    traces: TraceReader | None = None,
) -> FastAPI:
    """Build the orchestrator; `tools_factory` builds the tool registry at startup;
    `traces` reads traces back (default: as the settings say)."""
    settings = settings or OrchestratorSettings()
    configure_logging(
        "orchestrator", log_dir=settings.log_dir, level=settings.log_level, fmt=settings.log_format
    )
    traces = traces or trace_reader(settings)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            cache = create_cache(
                settings.redis_url,
                timeout_s=settings.redis_timeout_s,
                max_entries=settings.cache_max_entries,
            )
            stack.push_async_callback(cache.close)
            registry = await tools_factory(settings, cache, stack)
            planner = ServiceClient(
                "planner", settings.planner_url, connect_timeout_s=settings.connect_timeout_s
            )
            verifier = ServiceClient(
                "verifier", settings.verifier_url, connect_timeout_s=settings.connect_timeout_s
            )
            stack.push_async_callback(planner.close)
            stack.push_async_callback(verifier.close)
            app.state.reason = ReasonService(
                planner=planner,
                verifier=verifier,
                registry=registry,
                cache=cache,
                cache_ttl_s=settings.cache_ttl_s,
                max_replans=settings.max_replans,
                replan_on=settings.replan_on,
                calibrator=Calibrators.load(settings.confidence_calibrator),
                max_tool_calls=settings.max_tool_calls_per_request,
                sandbox_jobs_per_tenant=settings.sandbox_jobs_per_tenant(),
            )
            app.state.chat = ChatServing(app.state.reason)
            state.update(registry=registry, cache=cache)
            yield

    async def calibrator_note(client: httpx.AsyncClient) -> str:
        """'' when an answer-confidence calibrator was fitted for the model the planner
        serves (or either is unknown), else a note saying none was; logged once per
        model. Confidences and `verified` from another model's calibrator are not
        calibrated: an operator who switched to a model without one needs to know, the
        service still serves."""
        try:  # asked on every probe: a planner redeployed with another model is seen
            r = await client.get(f"{settings.planner_url}/info")
            model = ModelInfo.model_validate(r.json()).model
        except (httpx.HTTPError, ValueError):
            return ""  # a planner without /info, or a passing fault: the next probe asks
        calibrators = app.state.reason.calibrators
        if calibrators.fitted_for(model) is not False:
            return ""
        calibrator = calibrators.default
        fitted = calibrator.fitted_for.get("planner_models") or []
        if state.get("calibrator_warned") != model:
            state["calibrator_warned"] = model
            log.warning(
                "the confidence calibrator was fitted for another planner model",
                **{
                    "event.action": "confidence.calibrator_mismatch",
                    "labels.planner_model": model,
                    "labels.calibrator_models": ",".join(fitted),
                    "labels.calibrator_version": calibrator.version,
                },
            )
        return f"; confidence calibrator {calibrator.version} fitted for {', '.join(fitted)}, not {model}"

    async def readiness() -> tuple[bool, str]:
        if "registry" not in state:
            return False, "starting"
        note = ""
        try:
            async with httpx.AsyncClient(timeout=1.0) as client:
                r = await client.get(f"{settings.planner_url}/readyz")
                planner_ok = r.status_code == 200
                if planner_ok:
                    note = await calibrator_note(client)
        except httpx.HTTPError:
            planner_ok = False
        cache_ok = await state["cache"].ping()
        # The tools that report health (the python tool: every sandbox worker live).
        tools_ok, tools_reason = state["registry"].health()
        reason = (
            f"planner {'ready' if planner_ok else 'unreachable'}; "
            f"cache {state['cache'].kind} {'ok' if cache_ok else 'down (serving without)'}; "
            f"{tools_reason}{note}"
        )
        return planner_ok and tools_ok, reason

    app = create_service_app(
        name="orchestrator",
        lifespan=lifespan,
        readiness=readiness,
        limits=settings.http_limits(),
        # the console keeps its API key in this origin's session storage: no page of
        # this origin loads a script from elsewhere (FastAPI's /docs load theirs from a CDN)
        api_docs=False,
        # the OpenAI-compatible routes answer every error in OpenAI's shape
        error_formats={"/v1/": openai_error},
    )
    in_flight = TenantCounter(settings.tenant_max_in_flight)

    async def tenant_of(request: Request) -> str:
        """The API key's tenant; with keys configured, every later line of the request
        names it (`labels.tenant`: the name, never the key), which is what lets
        `GET /traces/{trace_id}` show a tenant its own requests only. Async, so that it
        binds in the request's own context (a sync dependency runs in a thread)."""
        if not settings.api_keys:
            return "default"
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token:
            for key, tenant in settings.api_keys.items():
                if hmac.compare_digest(key.encode(), token.strip().encode()):
                    bind_tenant(tenant)
                    return tenant
        raise Unauthorized("missing or invalid API key; send Authorization: Bearer <key>")

    def limited_tenant(request: Request, tenant: str = Depends(tenant_of)) -> str:
        """The tenant the per-tenant limits count: the key's, else the client address."""
        if settings.api_keys:
            return tenant
        return f"client:{request.client.host if request.client else 'unknown'}"

    def admit(who: str) -> Callable[[], None]:
        if not in_flight.try_enter(who):
            raise TooManyRequests(
                f"this tenant already has {settings.tenant_max_in_flight} requests in flight, "
                "its share; retry when one has finished"
            )
        return lambda: in_flight.leave(who)

    @app.post("/reason", response_model=ReasonResponse)
    async def reason(
        body: ReasonRequest,
        request: Request,
        tenant: str = Depends(tenant_of),
        who: str = Depends(limited_tenant),
        events: StreamEvents = "steps",
    ) -> Any:
        service: ReasonService = request.app.state.reason
        release = admit(who)
        if "text/event-stream" in request.headers.get("accept", ""):
            return event_stream(
                _stream(service, body, tenant, limits_tenant=who, events=events), release
            )
        try:
            return await cancel_on_disconnect(
                request, service.reason(body, tenant=tenant, limits_tenant=who)
            )
        finally:
            release()

    @app.post("/tools/{name}/run", response_model=ToolRunResult)
    async def run_tool(
        name: str,
        body: ToolRunRequest,
        request: Request,
        tenant: str = Depends(tenant_of),
        who: str = Depends(limited_tenant),
    ) -> ToolRunResult:
        service: ReasonService = request.app.state.reason
        tool = service.registry.get(name)
        if tool is None:
            raise NotFound(
                f"no tool named {name[:64]!r}; tools: {', '.join(service.registry.names)}",
                param="name",
            )
        release = admit(who)
        try:
            timeout_s = min(body.timeout_s or tool.timeout_s, 60.0)
            ctx = ToolContext(
                trace_id=tracing.current_trace_id(), tenant=tenant, timeout_s=timeout_s
            )
            outcome = await service.executor.run_tool(name, body.input, ctx, slots_tenant=who)
            return outcome.result
        finally:
            release()

    @app.get("/traces/{trace_id}", response_model=TraceView)
    async def get_trace(
        trace_id: str,
        tenant: str = Depends(tenant_of),
        who: str = Depends(limited_tenant),
    ) -> TraceView:
        trace_id = trace_id.lower()  # as `reason trace` takes it
        if not is_trace_id(trace_id):
            raise ValidationFailed(
                "trace_id: a trace id is 32 lowercase hexadecimal characters, not all zero",
                param="trace_id",
            )
        release = admit(who)
        try:
            # with keys, a tenant sees its own requests' lines only: a trace it has no
            # request in is as unknown to it as one nobody wrote
            view = await traces.read(trace_id, tenant=tenant if settings.api_keys else None)
        except TraceLookupError as exc:
            # the detail (the cluster's address, its own error text) is for the operator
            log.warning(
                "trace lookup failed",
                **{"event.action": "traces.lookup", "error.message": str(exc)},
            )
            where = "Elasticsearch" if traces.source == "elasticsearch" else "the log files"
            raise DependencyUnavailable(
                f"trace lookup failed: {where} could not be read in full; retry shortly"
            ) from None
        finally:
            release()
        if view is None:
            raise NotFound(f"no log lines for trace {trace_id}", param="trace_id")
        return view

    app.include_router(openai_router(auth=tenant_of, limited=limited_tenant, admit=admit))

    @app.get("/console/config", response_model=ConsoleConfig)
    async def console_config() -> ConsoleConfig:
        """Public: whether the console must ask for an API key (never the keys), and the
        bounds of the /reason options."""
        return CONSOLE_CONFIG.model_copy(update={"auth": bool(settings.api_keys)})

    @app.get("/", include_in_schema=False)
    async def console() -> FileResponse:
        return FileResponse(INDEX, headers=CONSOLE_HEADERS)

    # after /console/config, which the mount would otherwise answer
    app.mount(ConsoleFiles.path, ConsoleFiles(), name="console")
    return app


def trace_reader(settings: OrchestratorSettings) -> TraceReader:
    """Where `GET /traces/{trace_id}` reads from: Elasticsearch when configured, else the
    log files the services write."""
    es_url = settings.trace_es_url.get_secret_value() if settings.trace_es_url else None
    api_key = settings.trace_es_api_key.get_secret_value() if settings.trace_es_api_key else None
    return TraceReader(
        settings.trace_log_dir or settings.log_dir,
        es_url=es_url or None,
        es_index=settings.trace_es_index,
        es_api_key=api_key or None,
        timeout_s=settings.trace_es_timeout_s,
        scan_timeout_s=settings.trace_scan_timeout_s,
        max_lines=settings.trace_max_lines,
    )


_OPTIONS_SHOWN = ("n_plans", "verify", "use_cache", "contributions", "deadline_s")
CONSOLE_CONFIG = ConsoleConfig(
    auth=False,
    options={
        name: field
        for name, field in ReasonOptions.model_json_schema()["properties"].items()
        if name in _OPTIONS_SHOWN
    },
)


async def _stream(
    service: ReasonService,
    body: ReasonRequest,
    tenant: str,
    *,
    limits_tenant: str,
    events: StreamEvents = "steps",
) -> AsyncIterator[str]:
    """The /reason stream, then `result` or `error`. `events=steps` (the default, the
    stream as it always was): a `step` (StepResult) per finished step, and the error body.
    `events=all`: every event of the service as it happens (services.schemas: rounds,
    each plan before its steps run, steps with their round and plan), and an error with
    its status and retry time. A client written for the first never sees the second."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def on_event(name: str, event: StreamEvent) -> None:
        await queue.put((name, event.model_dump(mode="json")))

    async def on_step(step: StepResult) -> None:
        await queue.put(("step", step.model_dump(mode="json")))

    def error(exc: ServiceError) -> dict[str, Any]:
        if events == "all":
            return _stream_error(exc)
        return error_body(exc, tracing.current_trace_id())

    async def work() -> None:
        listen: dict[str, Any] = {"on_event": on_event} if events == "all" else {"on_step": on_step}
        try:
            result = await service.reason(
                body, tenant=tenant, limits_tenant=limits_tenant, **listen
            )
            await queue.put(("result", result.model_dump(mode="json")))
        except ServiceError as exc:
            # the request line says 200 (the stream had begun): this line says how it
            # ended, at the level the JSON answer's error would have been logged at
            ended = {
                "event.action": "reason.stream_error",
                "error.type": exc.error_type,
                "error.message": exc.message,
                "labels.status": exc.status_code,
            }
            if exc.status_code >= 500:
                log.warning("the stream ended with an error", **ended)
            else:
                log.info("the stream ended with an error", **ended)
            await queue.put(("error", error(exc)))
        except Exception:
            log.exception("stream failed")
            await queue.put(("error", error(ServiceError("internal error"))))

    task = asyncio.create_task(work())
    try:
        while True:
            event, data = await queue.get()
            yield sse_event(event, data)
            if event in ("result", "error"):
                break
    finally:
        if not task.done():  # the stream ended before the answer: its client went away
            task.cancel()
            log.info("client disconnected, work cancelled", **{"event.action": "request.cancelled"})


def _stream_error(exc: ServiceError) -> dict[str, Any]:
    body = StreamError(
        **error_body(exc, tracing.current_trace_id()),
        status=exc.status_code,
        retry_after_s=exc.retry_after_s,
    )
    return body.model_dump(mode="json", exclude_none=True)


def __getattr__(name: str) -> FastAPI:
    # `uvicorn orchestrator.app:app` builds the app from the environment on first access.
    if name == "app":
        return create_app()
    raise AttributeError(name)
