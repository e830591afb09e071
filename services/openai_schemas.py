"""Wire types of the orchestrator's OpenAI-compatible API (`GET /v1/models`,
`POST /v1/chat/completions`), on the same base as every other wire type.

The pipeline is one model, `reason-pipeline`. A chat completion answers the last message,
the user's question, through `/reason`; its options come from the extra body field
`reason` (a `ReasonOptions`, e.g. `extra_body={"reason": {"n_plans": 5}}` with the
`openai` client). No OpenAI field means one of them: `n` counts the choices returned and
must be 1, where `reason.n_plans` counts the plans drawn and voted on. What the pipeline
found besides the answer (steps, verdict, confidence, agreement, trace id) travels in
the extra response field `reason` (the whole `ReasonResponse`) and, as text for the
clients that show a model's reasoning, in the message's `reasoning_content`.

Fields of OpenAI's request that the pipeline has no meaning for are declared here only
to be refused by name (`refused_field`), unless they carry their neutral value (`n: 1`,
`response_format: {"type": "text"}`, ...); a field OpenAI does not define either is an
unknown field, refused like any other.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from services.schemas import (
    MAX_QUESTION_CHARS,
    ModelInfo,
    PlanEvent,
    ReasonOptions,
    ReasonResponse,
    RoundEnd,
    RoundStart,
    StepEvent,
    Wire,
)

MODEL_ID = "reason-pipeline"
MAX_MESSAGES = 256
# A message's text: at most what a question may be, many times over for the history the
# pipeline does not read but a client sends (bounded all the same).
MAX_MESSAGE_CHARS = 16 * MAX_QUESTION_CHARS


# --------------------------------------------------------------------------- request


class ChatMessage(Wire):
    """One message. Text only: `content` is a string or a list of `{"type": "text",
    "text": ...}` parts, joined into one string."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | None = None
    name: Annotated[str, Field(max_length=64)] | None = None
    # what an earlier answer of this API carried, for a client that sends it back
    reasoning_content: str | None = None
    refusal: None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            texts = []
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str) or len(part) != 2:
                    raise ValueError(
                        f"only text content parts ({{'type': 'text', 'text': ...}}) are "
                        f"supported, not {str(kind)[:40]!r}"
                    )
                texts.append(part["text"])
            value = "".join(texts)
        if isinstance(value, str) and len(value) > MAX_MESSAGE_CHARS:
            raise ValueError(f"at most {MAX_MESSAGE_CHARS} characters")
        return value


class StreamOptions(Wire):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(Wire):
    model: Annotated[str, Field(max_length=256)]
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    # the /reason options (the extra body: `extra_body={"reason": {...}}`)
    reason: ReasonOptions | None = None

    # OpenAI's fields with no meaning here: refused by name unless at their neutral value
    # (refused_field); typed loosely, since nothing but their presence is read.
    audio: Any = None
    frequency_penalty: Any = None
    function_call: Any = None
    functions: Any = None
    logit_bias: Any = None
    logprobs: Any = None
    max_completion_tokens: Any = None
    max_tokens: Any = None
    metadata: Any = None
    modalities: Any = None
    parallel_tool_calls: Any = None
    prediction: Any = None
    presence_penalty: Any = None
    prompt_cache_key: Any = None
    reasoning_effort: Any = None
    response_format: Any = None
    safety_identifier: Any = None
    seed: Any = None
    service_tier: Any = None
    stop: Any = None
    store: Any = None
    temperature: Any = None
    tool_choice: Any = None
    tools: Any = None
    top_logprobs: Any = None
    top_p: Any = None
    user: Any = None
    verbosity: Any = None
    web_search_options: Any = None

    def refused_field(self) -> tuple[str, str] | None:
        """The first field set to something the pipeline does not support, and why; None
        when every field is supported or at its neutral value."""
        if self.n not in (None, 1):
            return "n", (
                "n asks for n choices and the pipeline answers with one: send n=1 or leave "
                "it out. For the number of plans drawn and voted on, send reason.n_plans "
                '(extra_body={"reason": {"n_plans": 5}})'
            )
        if self.stream_options is not None and self.stream_options.include_usage:
            return "stream_options.include_usage", (
                "token usage is not reported: the pipeline's work is several model calls "
                "and tool runs, not one completion's tokens"
            )
        for name, reason in _REFUSED.items():
            value = getattr(self, name)
            if value is not None and value not in _NEUTRAL.get(name, ()):
                return name, f"{name} is not supported: {reason}"
        return None


_TOOLS = "the pipeline's planner chooses its own tools (python, calc, sql, lookup)"
_SAMPLING = "sampling is the pipeline's own (its planner's settings and reason.n_plans)"
_LENGTH = "the answer is the pipeline's final value, not a text to cut to a length"
_REFUSED: dict[str, str] = {
    "tools": _TOOLS,
    "tool_choice": _TOOLS,
    "functions": _TOOLS,
    "function_call": _TOOLS,
    "parallel_tool_calls": _TOOLS,
    "web_search_options": _TOOLS,
    "temperature": _SAMPLING,
    "top_p": _SAMPLING,
    "seed": _SAMPLING,
    "frequency_penalty": _SAMPLING,
    "presence_penalty": _SAMPLING,
    "logit_bias": _SAMPLING,
    "reasoning_effort": _SAMPLING,
    "verbosity": _SAMPLING,
    "logprobs": "the answer is voted over executed plans; it has no token probabilities",
    "top_logprobs": "the answer is voted over executed plans; it has no token probabilities",
    "max_tokens": _LENGTH,
    "max_completion_tokens": _LENGTH,
    "stop": _LENGTH,
    "prediction": _LENGTH,
    "response_format": "the answer is text; the structured result is the `reason` field",
    "modalities": "text only",
    "audio": "text only",
    "store": "nothing is stored: a trace of every request is in the services' logs",
    "metadata": "nothing is stored: a trace of every request is in the services' logs",
    "service_tier": "there is one tier",
    "prompt_cache_key": "answers are cached by question and options (reason.use_cache)",
    "user": "end users are not tracked; the API key names the tenant",
    "safety_identifier": "end users are not tracked; the API key names the tenant",
}
# Values of refused fields that ask for nothing (what leaving them out means).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "logprobs": (False,),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    "store": (False,),
    "service_tier": ("auto", "default"),
}


# --------------------------------------------------------------------------- response


class AssistantMessage(Wire):
    role: Literal["assistant"] = "assistant"
    content: str | None  # the answer; None when the pipeline found none
    # the plans, steps and vote as text, for clients that show a model's reasoning
    reasoning_content: str | None = None


class Choice(Wire):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop"] = "stop"
    logprobs: None = None


class ChatCompletion(Wire):
    id: str  # chatcmpl-<trace id>
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    # the pipeline's whole response: steps, verdict, confidence, agreement, trace id
    reason: ReasonResponse


class Delta(Wire):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None


class ChunkChoice(Wire):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop"] | None = None
    logprobs: None = None


class ChunkReason(Wire):
    """The `reason` field of a streamed chunk: one event of the /reason stream (as
    `/reason?events=all` sends it, under its event name), or, on the last chunk, the whole
    response."""

    round_start: RoundStart | None = None
    plan: PlanEvent | None = None
    step: StepEvent | None = None
    round_end: RoundEnd | None = None
    result: ReasonResponse | None = None


class ChatCompletionChunk(Wire):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    reason: ChunkReason | None = None


# --------------------------------------------------------------------------- models


class PipelineMetadata(Wire):
    """What `GET /v1/models` says about the pipeline beside OpenAI's fields."""

    description: str
    # the models behind it, as each service's GET /info names them (None: it did not
    # answer within a second)
    planner: ModelInfo | None = None
    verifier: ModelInfo | None = None
    n: str  # what OpenAI's `n` means here, and where n_plans goes
    # the extra body field `reason`: the JSON schema of each /reason option
    extra_body: dict[str, dict[str, Any]]


class ModelCard(Wire):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    metadata: PipelineMetadata


class ModelList(Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --------------------------------------------------------------------------- errors


class OpenAIErrorDetail(Wire):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(Wire):
    """Every error under `/v1/` (services.errors.openai_error), as a body or, once a
    stream has begun, as its last data line before `[DONE]`."""

    error: OpenAIErrorDetail
