"""The OpenAI-compatible front door: `GET /v1/models` and `POST /v1/chat/completions`.

A chat completion is a `/reason` request: the same auth, tenant and per-tenant limit
(the dependencies `create_app` passes `openai_router`), the same `ReasonService.reason`
call (answer cache, deadline, trace id), only the wire shapes differ
(services/openai_schemas.py) and the errors take OpenAI's shape
(services.errors.openai_error, for every path under /v1/). `ChatServing` maps one shape
to the other; the router only fetches it and holds the tenant's slot.

`stream: true` sends the work as it happens, as OpenAI chunks (`data: {...}` lines): each
plan, step and round's vote as `reasoning_content` text with the event itself in the
chunk's `reason` field, then the answer as `content`, then a last chunk with
`finish_reason: "stop"` and the whole response in `reason.result`, then `data: [DONE]`.
The response starts only once the first event is there, so that what fails before
anything could be streamed (the planner down, the deadline passed before a plan) is an
error with its status and Retry-After, as a JSON request gets it; a failure after that
is the stream's last data line, an OpenAI error body.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import structlog
from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from orchestrator.service import ReasonService, fetch_info
from services import tracing
from services.app import cancel_on_disconnect, event_stream
from services.errors import (
    InvalidRequest,
    ModelNotFound,
    ServiceError,
    UnsupportedParameter,
    ValidationFailed,
    openai_error,
)
from services.openai_schemas import (
    MODEL_ID,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    ChunkReason,
    Delta,
    ModelCard,
    ModelList,
    PipelineMetadata,
)
from services.schemas import (
    PlanEvent,
    ReasonOptions,
    ReasonRequest,
    ReasonResponse,
    RoundEnd,
    StepEvent,
    StepResult,
    StreamEvent,
)

log = structlog.get_logger("orchestrator")

CLIP_CHARS = 200  # a step's input and output in the reasoning text (in full in `reason`)


class ChatServing:
    """Maps chat completions to `/reason` requests and their answers back."""

    def __init__(self, reason: ReasonService, *, created: int | None = None) -> None:
        self.reason = reason
        self.created = created if created is not None else int(time.time())

    # ---------------------------------------------------------------- /v1/models

    async def models(self) -> ModelList:
        planner, verifier = await asyncio.gather(
            fetch_info(self.reason.planner), fetch_info(self.reason.verifier)
        )
        metadata = PipelineMetadata(
            description=(
                "A planner writes plans of tool calls, the orchestrator runs them and votes, "
                "a verifier scores the answer; the answer is the message content, the rest "
                "is in the response's `reason` field"
            ),
            planner=planner,
            verifier=verifier,
            n=(
                "n counts the choices returned and must be 1; reason.n_plans (extra body) "
                "counts the plans drawn and voted on"
            ),
            extra_body={"reason": ReasonOptions.model_json_schema()["properties"]},
        )
        card = ModelCard(id=MODEL_ID, created=self.created, owned_by="reason", metadata=metadata)
        return ModelList(data=[card])

    # ---------------------------------------------------------------- requests

    def reason_request(self, body: ChatCompletionRequest) -> ReasonRequest:
        """The `/reason` request a chat completion asks: the last message, the user's, as
        the question; the options from `reason`. Refuses what it cannot serve."""
        if body.model != MODEL_ID:
            raise ModelNotFound(
                f"the model {body.model[:64]!r} does not exist; this API serves {MODEL_ID!r}",
                param="model",
            )
        refused = body.refused_field()
        if refused is not None:
            raise UnsupportedParameter(refused[1], param=refused[0])
        last = len(body.messages) - 1
        message = body.messages[last]
        if message.role != "user":
            raise InvalidRequest(
                "messages: the last message must be the user's question "
                f"(it is the {message.role}'s); earlier messages are not read",
                param=f"messages.{last}.role",
            )
        try:
            return ReasonRequest(
                question=message.content or "", options=body.reason or ReasonOptions()
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValidationFailed(
                f"messages.{last}.content: the question: {first['msg']}",
                param=f"messages.{last}.content",
            ) from None

    async def complete(
        self, request: ReasonRequest, *, tenant: str, limits_tenant: str
    ) -> ChatCompletion:
        response = await self.reason.reason(request, tenant=tenant, limits_tenant=limits_tenant)
        return self.completion(response)

    def completion(self, response: ReasonResponse) -> ChatCompletion:
        message = AssistantMessage(
            content=response.answer, reasoning_content=reasoning_text(response)
        )
        return ChatCompletion(
            id=completion_id(response.trace_id),
            created=int(time.time()),
            model=MODEL_ID,
            choices=[Choice(message=message)],
            reason=response,
        )

    def stream(self, request: ReasonRequest, *, tenant: str, limits_tenant: str) -> ChatStream:
        return ChatStream(self, request, tenant=tenant, limits_tenant=limits_tenant)


class ChatStream:
    """One streamed chat completion: the work runs in a task and sends its events through
    a queue; `first()` waits for the first one (raising the error, when that is what
    came first), `lines()` then sends everything as SSE data lines."""

    def __init__(
        self, serving: ChatServing, request: ReasonRequest, *, tenant: str, limits_tenant: str
    ) -> None:
        self._serving = serving
        self._request = request
        self._tenant = tenant
        self._limits_tenant = limits_tenant
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._pending: list[tuple[str, Any]] = []  # what first() took from the queue
        self._id = ""
        self._created = int(time.time())
        self._steps_sent = False

    async def first(self) -> None:
        """Wait for the first event that says something: a round's start does not, nor
        the end of a round that failed (the round may yet fail before any plan, and a
        first round that failed ends in the request's error)."""
        self._id = completion_id(tracing.current_trace_id())
        self._task = asyncio.create_task(self._work())
        try:
            while True:
                item = await self._queue.get()
                if item[0] == "error":
                    raise item[1]
                self._pending.append(item)
                name, payload = item
                failed_round = isinstance(payload, RoundEnd) and payload.error is not None
                if name != "round_start" and not failed_round:
                    return
        except asyncio.CancelledError:
            self._task.cancel()
            raise

    async def _work(self) -> None:
        async def on_event(name: str, event: StreamEvent) -> None:
            await self._queue.put((name, event))

        try:
            result = await self._serving.reason.reason(
                self._request,
                tenant=self._tenant,
                limits_tenant=self._limits_tenant,
                on_event=on_event,
            )
            await self._queue.put(("result", result))
        except ServiceError as exc:
            if self._pending:  # the stream had begun: its request line says 200
                log.info(
                    "the stream ended with an error",
                    **{
                        "event.action": "v1.stream_error",
                        "error.type": exc.error_type,
                        "error.message": exc.message,
                        "labels.status": exc.status_code,
                    },
                )
            await self._queue.put(("error", exc))
        except Exception:
            log.exception("chat completion stream failed")
            await self._queue.put(("error", ServiceError("internal error")))

    async def lines(self) -> AsyncIterator[str]:
        assert self._pending and self._task is not None, "first() comes first"
        try:
            yield self._data(self._chunk(Delta(role="assistant", content="")))
            while True:
                name, payload = self._pending.pop(0) if self._pending else await self._queue.get()
                if name == "error":
                    _, body = openai_error(payload, self._id.removeprefix("chatcmpl-"))
                    yield self._data(body)
                    break
                for chunk in self._chunks(name, payload):
                    yield self._data(chunk)
                if name == "result":
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not self._task.done():  # its client went away before the answer
                self._task.cancel()
                log.info(
                    "client disconnected, work cancelled", **{"event.action": "request.cancelled"}
                )

    def _chunks(self, name: str, payload: Any) -> list[ChatCompletionChunk]:
        if name == "result":
            response: ReasonResponse = payload
            # a cached answer streamed no steps: its reasoning comes whole, with it
            text = reasoning_text(response) if not self._steps_sent else verdict_line(response)
            chunks = [self._chunk(Delta(reasoning_content=text))]
            if response.answer is not None:
                chunks.append(self._chunk(Delta(content=response.answer)))
            chunks.append(self._chunk(Delta(), finish="stop", reason=ChunkReason(result=response)))
            return chunks
        self._steps_sent = True
        text = event_text(payload)
        delta = Delta(reasoning_content=text) if text else Delta()
        return [self._chunk(delta, reason=ChunkReason(**{name: payload}))]

    def _chunk(
        self,
        delta: Delta,
        *,
        finish: Literal["stop"] | None = None,
        reason: ChunkReason | None = None,
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self._id,
            created=self._created,
            model=MODEL_ID,
            choices=[ChunkChoice(delta=delta, finish_reason=finish)],
            reason=reason,
        )

    @staticmethod
    def _data(item: ChatCompletionChunk | dict[str, Any]) -> str:
        if isinstance(item, ChatCompletionChunk):
            data = item.model_dump(mode="json")
            # a delta names only what it adds, as OpenAI's do; the payloads keep their nulls
            for choice in data["choices"]:
                choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
            if data["reason"] is None:
                del data["reason"]
            item = data
        return f"data: {json.dumps(item, separators=(',', ':'))}\n\n"


def completion_id(trace_id: str) -> str:
    return f"chatcmpl-{trace_id}"


# --------------------------------------------------------------------------- text


def _clip(text: str | None, n: int = CLIP_CHARS) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def step_line(step: StepResult, prefix: str = "") -> str:
    shown = step.output if step.output is not None else step.error
    source = f", {step.source}" if step.source != "tool" else ""
    return (
        f"{prefix}{step.id} {step.tool} [{step.status}{source}, {step.latency_ms:.0f} ms] "
        f"{_clip(step.input)} -> {_clip(shown)}\n"
    )


def event_text(event: StreamEvent) -> str:
    """One /reason stream event as a line of reasoning text (a round's start has none)."""
    if isinstance(event, PlanEvent):
        where = f" (round {event.round})" if event.round > 1 else ""
        return f"Plan {event.plan + 1}{where}: {_clip(event.reasoning)}\n"
    if isinstance(event, StepEvent):
        return step_line(event, prefix=f"  plan {event.plan + 1} ")
    if isinstance(event, RoundEnd):
        if event.error:
            return f"Round {event.round} failed: {event.error}\n"
        return (
            f"Round {event.round}: {event.agreeing} of {event.samples} agree on "
            f"{_clip(event.answer, 40)}\n"
        )
    return ""


def verdict_line(response: ReasonResponse) -> str:
    cached = " (cached)" if response.cached else ""
    return (
        f"Answer {_clip(response.answer, 40)}: {response.verdict}, confidence "
        f"{response.confidence:.2f}{cached}; trace {response.trace_id}\n"
    )


def reasoning_text(response: ReasonResponse) -> str:
    """The served answer's work as text: its plan and steps (or its worked solution), the
    vote when there was one, the verdict and confidence."""
    lines = []
    if response.plan is not None:
        lines.append(f"Plan: {_clip(response.plan.reasoning)}\n")
    lines.extend(step_line(step, prefix="  ") for step in response.steps)
    if response.solution is not None:
        lines.append(f"Worked solution: {_clip(response.solution.text, 1000)}\n")
    if response.agreement is not None:
        a = response.agreement
        lines.append(f"Vote: {a.agreeing} of {a.plans} agree\n")
    lines.append(verdict_line(response))
    return "".join(lines)


# --------------------------------------------------------------------------- routes


def openai_router(
    *,
    auth: Callable[..., Any],
    limited: Callable[..., Any],
    admit: Callable[[str], Callable[[], None]],
) -> APIRouter:
    """The /v1 routes, behind `auth` (the API key's tenant) and `limited` (whom the
    per-tenant limit counts), with `admit` taking the tenant's slot: /reason's own."""
    router = APIRouter(prefix="/v1")

    @router.get("/models", response_model=ModelList)
    async def models(request: Request, _: str = Depends(auth)) -> ModelList:
        serving: ChatServing = request.app.state.chat
        return await serving.models()

    @router.post("/chat/completions", response_model=ChatCompletion)
    async def chat_completions(
        body: ChatCompletionRequest,
        request: Request,
        tenant: str = Depends(auth),
        who: str = Depends(limited),
    ) -> Any:
        serving: ChatServing = request.app.state.chat
        reason_request = serving.reason_request(body)
        release = admit(who)
        if body.stream:
            stream = serving.stream(reason_request, tenant=tenant, limits_tenant=who)
            try:
                closed = await cancel_on_disconnect(request, stream.first())
            except BaseException:
                release()
                raise
            if closed is not None:  # its client went away before the first event
                release()
                return closed
            return event_stream(stream.lines(), release)
        try:
            return await cancel_on_disconnect(
                request, serving.complete(reason_request, tenant=tenant, limits_tenant=who)
            )
        finally:
            release()

    return router
