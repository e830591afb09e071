"""Wire schemas shared by the planner, orchestrator and verifier.

Every request and response body that crosses a service boundary is defined here, on
one base that rejects unknown fields. A schema change is one diff every service sees.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

MAX_QUESTION_CHARS = 4000
MAX_STEPS = 12
MAX_STEP_INPUT_CHARS = 4000
MAX_STATEMENT_CHARS = 8000
MAX_CONTEXT_CHARS = 16000
PLAN_REASONING_CHARS = 1000  # Plan.reasoning's bound on the wire
STEP_ID_PATTERN = r"^s([1-9]|1[0-2])$"
TOOL_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"


class Wire(BaseModel):
    """Base of every wire type: unknown fields are an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must contain non-whitespace characters")
    return value


Question = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUESTION_CHARS)]
StepId = Annotated[str, StringConstraints(pattern=STEP_ID_PATTERN)]
ToolName = Annotated[str, StringConstraints(pattern=TOOL_NAME_PATTERN)]


# --------------------------------------------------------------------------- plans


class PlanStep(Wire):
    id: StepId
    tool: ToolName
    input: Annotated[str, StringConstraints(min_length=1, max_length=MAX_STEP_INPUT_CHARS)]
    depends_on: list[StepId] = Field(default_factory=list, max_length=MAX_STEPS)


class Plan(Wire):
    reasoning: Annotated[str, StringConstraints(max_length=PLAN_REASONING_CHARS)]
    steps: list[PlanStep] = Field(min_length=1, max_length=MAX_STEPS)
    answer_step: StepId


# --------------------------------------------------------------------------- tools


class ToolSpec(Wire):
    """What the planner is told about a tool; the orchestrator owns the implementation."""

    name: ToolName
    description: Annotated[str, StringConstraints(min_length=1, max_length=1000)]
    input_format: Annotated[str, StringConstraints(min_length=1, max_length=1000)]
    example: Annotated[str, StringConstraints(max_length=500)] = ""


StepStatus = Literal["ok", "error", "timeout", "fallback", "skipped"]
StepSource = Literal["tool", "cache", "fallback"]


class ToolRunRequest(Wire):
    input: Annotated[str, StringConstraints(min_length=1, max_length=MAX_STEP_INPUT_CHARS)]
    timeout_s: Annotated[float, Field(gt=0, le=60)] | None = None


class ToolRunResult(Wire):
    tool: str
    input: str
    status: StepStatus
    output: str | None = None
    error: str | None = None
    source: StepSource = "tool"
    latency_ms: float = 0.0


# What the answer did when a step's value was changed (`perturbed`) or taken away
# (`removed`) and the steps after it ran again (orchestrator.contribution): `changed`,
# `same`, `failed` (the answer was lost), `unused` (no path to the answer uses the step),
# `unknown` (not measured: the step gave no value, or the counterfactual did not fit in
# its budget of tool calls or the deadline).
CounterfactualEffect = Literal["changed", "same", "failed", "unused", "unknown"]


class StepContribution(Wire):
    perturbed: CounterfactualEffect
    removed: CounterfactualEffect
    # the answer depends on this step (either counterfactual changed or lost it); False:
    # it contributes nothing; None: not known
    contributes: bool | None


class StepResult(ToolRunResult):
    id: str
    # with the request option `contributions`: what this step contributes to the answer
    contribution: StepContribution | None = None


# --------------------------------------------------------------------------- planner


class PlanRequest(Wire):
    question: Question
    n: Annotated[int, Field(ge=1, le=8)] = 1
    # Samples offset .. offset + n - 1 of the question: a second request for more samples
    # (adaptive self-consistency) gets new ones, those one request for all would have had.
    offset: Annotated[int, Field(ge=0, le=7)] = 0
    # True: n different plans (a repeated sample is drawn again). False: n independent
    # samples, repeats kept, as a vote over samples needs them.
    distinct: bool = True
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    tools: list[ToolSpec] | None = Field(default=None, max_length=32)
    feedback: Annotated[str, StringConstraints(max_length=MAX_CONTEXT_CHARS)] | None = None

    _blank = field_validator("question")(_not_blank)


class PlanResponse(Wire):
    plans: list[Plan] = Field(max_length=8)  # at most the `n` asked for
    model: str
    backend: str
    latency_ms: float


SOLUTION_TEXT_CHARS = 4000
SOLUTION_ANSWER_CHARS = 64


class SolveRequest(Wire):
    """The model's own chain-of-thought solutions to a question, no tools."""

    question: Question
    n: Annotated[int, Field(ge=1, le=8)] = 1
    # Solutions offset .. offset + n - 1: solution 0 is the greedy one, the rest sampled
    # (a second request for more gets new ones, those one request for all would have had).
    offset: Annotated[int, Field(ge=0, le=7)] = 0
    temperature: Annotated[float, Field(gt=0, le=2)] | None = None  # of the sampled ones

    _blank = field_validator("question")(_not_blank)


class Solution(Wire):
    text: Annotated[str, StringConstraints(max_length=SOLUTION_TEXT_CHARS)]
    # the last number of the text (services.answers); None: the text states none
    answer: Annotated[str, StringConstraints(max_length=SOLUTION_ANSWER_CHARS)] | None = None


class SolveResponse(Wire):
    solutions: list[Solution] = Field(max_length=8)
    model: str
    backend: str
    latency_ms: float


# --------------------------------------------------------------------------- verifier


class VerifyRequest(Wire):
    question: Annotated[str, StringConstraints(max_length=MAX_QUESTION_CHARS)] | None = None
    statement: Annotated[str, StringConstraints(min_length=1, max_length=MAX_STATEMENT_CHARS)]
    context: Annotated[str, StringConstraints(max_length=MAX_CONTEXT_CHARS)] = ""

    _blank = field_validator("statement")(_not_blank)


VerifyMethod = Literal["symbolic", "model", "both"]


class VerifyResponse(Wire):
    verdict: bool
    confidence: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    method: VerifyMethod
    latency_ms: float


class VerifyBatchRequest(Wire):
    items: list[VerifyRequest] = Field(min_length=1, max_length=16)


class VerifyBatchResponse(Wire):
    results: list[VerifyResponse]
    latency_ms: float


class ModelInfo(Wire):
    """`GET /info` (planner, verifier): the model this service serves, for those that
    name it (the orchestrator's `GET /v1/models`)."""

    service: str
    backend: str  # llamacpp, vllm, openai, scripted (planner); model, scripted (verifier)
    model: str
    ready: bool  # loaded and healthy, as /readyz says


# --------------------------------------------------------------------------- orchestrator


MAX_PLANS = 8  # plans a request may ask for (n_plans)
MAX_PROSE = 8  # chain-of-thought solutions a request may ask for (n_prose)
MAX_REPLANS = 5  # the most replanning rounds the orchestrator may be set to run
# How many rounds one response can report: the first and every replan.
MAX_ROUNDS = MAX_REPLANS + 1


class ReasonOptions(Wire):
    n_plans: Annotated[int, Field(ge=1, le=MAX_PLANS)] = 1
    # With n_plans > 1: draw a majority of the plans first and the rest only when the
    # first ones' answers leave the vote open. With n_prose > 0 too: draw the first plan
    # and the greedy solution first, and the rest of both only when those two disagree.
    adaptive: bool = True
    # Chain-of-thought solutions (the planner's /solve: the model on its own, no tools)
    # drawn beside the first round's plans; each is one vote, as an executed plan is.
    n_prose: Annotated[int, Field(ge=0, le=MAX_PROSE)] = 0
    verify: bool = True
    use_cache: bool = True
    deadline_s: Annotated[float, Field(ge=0.1, le=120)] = 30.0
    # Measure what each step of the served plan contributes to its answer (its value
    # changed, then taken away, the steps after it run again: `StepResult.contribution`).
    contributions: bool = False


class ReasonRequest(Wire):
    question: Question
    options: ReasonOptions = Field(default_factory=ReasonOptions)

    _blank = field_validator("question")(_not_blank)


Verdict = Literal["verified", "rejected", "unverified"]


class Timings(Wire):
    plan: float = 0.0
    solve: float = 0.0  # chain-of-thought solutions (n_prose), alongside planning
    execute: float = 0.0
    verify: float = 0.0
    contribute: float = 0.0  # the counterfactual runs of the option `contributions`
    total: float = 0.0


VOTE_ANSWER_CHARS = 200


class Vote(Wire):
    """One sample's answer in the served round's vote (None: it gave no answer): an
    executed plan's, or one of the model's own chain-of-thought solutions."""

    source: Literal["plan", "prose"] = "plan"
    answer: Annotated[str, StringConstraints(max_length=VOTE_ANSWER_CHARS + 1)] | None


class Agreement(Wire):
    """How the self-consistency vote went (present when more than one plan ran): of the
    served round's `plans` drawn (fewer than `n_plans` when the first ones settled the
    vote), `agreeing` gave the served answer; `votes` lists every plan's answer in the
    order drawn (cut to 200 characters); `rounds` counts replanning rounds."""

    plans: int
    agreeing: int
    rounds: int = 1
    # every plan and every solution of the round: up to n_plans + n_prose
    votes: list[Vote] = Field(default_factory=list, max_length=MAX_PLANS + MAX_PROSE)


ReplanReason = Literal["no_answer", "rejected", "low_agreement"]
REPLAN_REASONS: tuple[ReplanReason, ...] = get_args(ReplanReason)  # most serious first


class RoundSummary(Wire):
    """One round of a request that replanned: its vote, how it would have been served,
    why it was worth another round, and what it cost."""

    # why this round ran: None for the first, else the previous round's reason
    replan_for: ReplanReason | None = None
    answer: Annotated[str, StringConstraints(max_length=VOTE_ANSWER_CHARS + 1)] | None
    samples: int  # plans and solutions voting in this round
    agreeing: int
    confidence: Annotated[float, Field(ge=0, le=1)]  # calibrated, as it would be served
    verdict: Verdict
    # every reason the round was worth another (only those in the service's
    # `replan_on` start one)
    replan_reasons: list[ReplanReason] = Field(default_factory=list, max_length=3)
    ms: float  # wall time of the round: planning, solving, executing, verifying
    # a replanning round that failed (no plan could be made, the planner was down or
    # slow): the error's type; the answer served then comes from an earlier round
    error: str | None = None


class Signals(Wire):
    """What the served confidence is computed from (orchestrator.confidence)."""

    agreement: Annotated[float, Field(ge=0, le=1)]  # share of the round's plans agreeing
    plans: Annotated[int, Field(ge=0)]  # samples (plans, solutions) in the served round
    # the served sample's work finished: every step of its plan ran, or its solution
    # states an answer
    complete: bool
    verifier: Annotated[float, Field(ge=0, le=1)] | None = None  # None: not asked / no reply
    rounds: Annotated[int, Field(ge=1)] = 1  # the served round: 1 the first, 2 the first replan


class ReasonResponse(Wire):
    trace_id: str
    answer: str | None
    verdict: Verdict
    # calibrated P(answer is right), from `signals`; `verified` needs the calibrator's
    # threshold
    confidence: Annotated[float, Field(ge=0, le=1)]
    signals: Signals | None = None
    plan: Plan | None
    steps: list[StepResult]
    # the served answer's chain-of-thought solution, when no executed plan gave it
    solution: Solution | None = None
    cached: bool = False
    cached_trace_id: str | None = None
    agreement: Agreement | None = None
    # present when the request replanned: every round in the order run (the one served
    # is the most trusted, not always the last)
    replanning: list[RoundSummary] | None = Field(default=None, max_length=MAX_ROUNDS)
    timings_ms: Timings


# --------------------------------------------------------------------------- /reason stream
# With `Accept: text/event-stream` and `?events=all`, /reason sends these events, in this
# order per round (without `events=all`, only `step` as a plain StepResult, then
# `result` or an ErrorBody `error`, as the stream always was):
# `round_start`, then for each plan as soon as it is made `plan` (before any of its steps
# runs), a `step` as each step finishes, `round_end` once the round's vote is known; and
# last `result` (a ReasonResponse) or `error` (a StreamError). An answer served from the
# cache sends `result` alone. Every event about a plan names it by `round` (1 the first,
# 2 the first replan) and `plan` (its index in the round's vote, in the order drawn).


class RoundStart(Wire):
    """SSE `round_start`: a round of plans begins."""

    round: Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
    replan_for: ReplanReason | None = None  # None for the first round


class PlanEvent(Plan):
    """SSE `plan`: a plan as the planner made it (validated), before its steps run."""

    round: Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
    plan: Annotated[int, Field(ge=0, lt=MAX_PLANS)]


class StepEvent(StepResult):
    """SSE `step`: a finished step. The StepResult of the response's `steps`, with the
    round and the plan it belongs to beside it (a client reading StepResult's fields
    reads them unchanged)."""

    round: Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
    plan: Annotated[int, Field(ge=0, lt=MAX_PLANS)]


class RoundVote(Vote):
    """One sample's vote in a finished round."""

    plan: Annotated[int, Field(ge=0, lt=MAX_PLANS)] | None = None  # None: a solution
    verifier: Annotated[float, Field(ge=0, le=1)] | None = None  # its score, when asked
    agrees: bool  # it gave the round's voted answer


class RoundEnd(RoundSummary):
    """SSE `round_end`: the round's vote (a failed round: its `error`, no votes)."""

    round: Annotated[int, Field(ge=1, le=MAX_ROUNDS)]
    votes: list[RoundVote] = Field(default_factory=list, max_length=MAX_PLANS + MAX_PROSE)


StreamEvent = RoundStart | PlanEvent | StepEvent | RoundEnd
# the SSE event name of each payload
STREAM_EVENT_NAMES: dict[type[Wire], str] = {
    RoundStart: "round_start",
    PlanEvent: "plan",
    StepEvent: "step",
    RoundEnd: "round_end",
}


# --------------------------------------------------------------------------- trace lookup


class TraceLine(Wire):
    """One log line of a trace (`GET /traces/{trace_id}`), from any of the services."""

    timestamp: str | None = None  # ECS @timestamp, as logged
    offset_ms: float | None = None  # since the trace's start (None: no readable time)
    service: str | None = None
    level: str | None = None
    message: str | None = None
    duration_ms: float | None = None  # event.duration, for lines that time something
    error: str | None = None  # error.message (or error.type) when the line has one
    fields: dict[str, Any] = Field(default_factory=dict)  # every field, flattened ECS


class TraceSpan(Wire):
    """The lines of one span (one request to one service), its children nested."""

    span_id: str
    parent_id: str | None = None
    service: str | None = None
    start_ms: float | None = None  # since the trace's start
    duration_ms: float | None = None  # the span's request line's duration, else its lines'
    error: bool = False  # a line at error level, with an error, or a 5xx status
    lines: list[TraceLine]
    children: list[TraceSpan] = Field(default_factory=list)


class TraceView(Wire):
    """`GET /traces/{trace_id}`: every log line of one request, as nested spans."""

    trace_id: str
    source: Literal["files", "elasticsearch"]
    lines: int  # log lines shown
    truncated: bool = False  # more lines than the lookup returns: the earliest shown
    started: str | None = None  # timestamp of the trace's start
    duration_ms: float | None = None
    spans: list[TraceSpan]


class ConsoleConfig(Wire):
    """`GET /console/config`: what the web console needs to know before it asks."""

    auth: bool  # /reason and /traces want `Authorization: Bearer <key>`
    # the JSON schema of each /reason option: its type, default and bounds
    options: dict[str, dict[str, Any]]


# --------------------------------------------------------------------------- errors


class ErrorDetail(Wire):
    type: str
    message: str
    param: str | None = None


class ErrorBody(Wire):
    error: ErrorDetail
    trace_id: str


class StreamError(ErrorBody):
    """SSE `error`: the error body, with the status and the Retry-After (seconds) the
    JSON answer would have carried (the stream's own status is 200 by then)."""

    status: int
    retry_after_s: int | None = None


TRACE_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def plan_json_schema(tool_names: list[str], *, reasoning_chars: int = 300) -> dict[str, Any]:
    """The JSON schema handed to constrained decoders.

    `reasoning_chars` bounds the free-text `reasoning` the model writes before the steps
    (at most the wire bound, `PLAN_REASONING_CHARS`).

    Every string and array is bounded so a decoder that counts characters (GBNF, an
    OpenAI-compatible server) cannot run on to its token limit, and the tool field is an
    enum of the registered tools. The xgrammar grammar of the llama.cpp and vLLM backends
    keeps every bound but the maximum length of step inputs, which `max_tokens` and plan
    validation take over so that code can hold escapes (planner.backends.schema_constraint).
    """
    step_ids = [f"s{i}" for i in range(1, MAX_STEPS + 1)]
    return {
        "type": "object",
        "properties": {
            "reasoning": {
                "type": "string",
                "maxLength": min(reasoning_chars, PLAN_REASONING_CHARS),
            },
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": 6,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "enum": step_ids},
                        "tool": {"type": "string", "enum": sorted(tool_names)},
                        "input": {"type": "string", "minLength": 1, "maxLength": 600},
                        "depends_on": {
                            "type": "array",
                            "items": {"type": "string", "enum": step_ids},
                            "maxItems": 6,
                        },
                    },
                    "required": ["id", "tool", "input", "depends_on"],
                    "additionalProperties": False,
                },
            },
            "answer_step": {"type": "string", "enum": step_ids},
        },
        "required": ["reasoning", "steps", "answer_step"],
        "additionalProperties": False,
    }
