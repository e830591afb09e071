"""Plan formats: how each asks for the plan, how a draft becomes a plan, and the planner's
draft path (read the draft, or transcribe it under the grammar when it cannot be read)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planner.backends.base import Generation, GenerationRequest
from planner.drafts import MAX_DRAFT_CHARS, plan_from_draft, with_answer
from planner.prompting import (
    PLAN_FORMATS,
    PROGRAM_REQUEST,
    build_messages,
    few_shot,
    program_messages,
    render_example,
    system_template,
    transcription_messages,
)
from planner.service import PlannerService
from services.errors import PlanInvalid, PlanningFailed
from services.plans import parse_plan
from services.schemas import PLAN_REASONING_CHARS, Plan, PlanRequest, plan_json_schema
from services.settings import PlannerSettings
from services.toolspecs import DEFAULT_TOOLS, tool_names

pytestmark = pytest.mark.unit

NAMES = tool_names()
CODE = "apples = 3\npears = 4\nresult = apples + pears"
DRAFT = f"She has 3 apples and 4 pears; add them.\n\n```python\n{CODE}\n```"


def calc_plan(expression: str) -> str:
    return json.dumps(
        {
            "reasoning": "add",
            "steps": [{"id": "s1", "tool": "calc", "input": expression, "depends_on": []}],
            "answer_step": "s1",
        }
    )


# --------------------------------------------------------------------------- prompts


def test_the_json_format_is_the_one_sentence_plan_prompt() -> None:
    system = system_template("json")
    assert "computes the answer, as one JSON object." in system
    assert '- "reasoning": one short sentence on how to get the answer.' in system
    assert "{format}" not in system and "{reasoning}" not in system and "{tools}" in system


def test_the_reasoning_format_asks_for_thinking_and_allows_it_in_the_schema() -> None:
    system = system_template("reasoning")
    assert "think the problem through first" in system
    assert plan_json_schema(NAMES)["properties"]["reasoning"]["maxLength"] == 300
    long = plan_json_schema(NAMES, reasoning_chars=PLAN_REASONING_CHARS)
    assert long["properties"]["reasoning"]["maxLength"] == PLAN_REASONING_CHARS
    # never past the wire's own bound
    assert (
        plan_json_schema(NAMES, reasoning_chars=10**6)["properties"]["reasoning"]["maxLength"]
        == PLAN_REASONING_CHARS
    )


def test_the_draft_format_keeps_the_tool_list_and_its_braces() -> None:
    messages = build_messages("q", list(DEFAULT_TOOLS), fmt="draft")
    system = messages[0]["content"]
    assert "```python" in system and '"answer_step"' in system
    for spec in DEFAULT_TOOLS:
        assert f"- {spec.name}: {spec.description}" in system


@pytest.mark.parametrize("fmt", PLAN_FORMATS)
def test_every_example_reads_back_as_its_plan(fmt: str) -> None:
    """What the model is shown is what the planner reads: each example, rendered in the
    format, gives back the example's steps (and, for the long formats, its thinking)."""
    assert all(example["thought"].strip() for example in few_shot())
    for example in few_shot():
        text = render_example(example, fmt)  # type: ignore[arg-type]
        plan = plan_from_draft(text, NAMES) if fmt == "draft" else parse_plan(text, NAMES)
        expected = Plan.model_validate(example["plan"])
        assert plan.steps == expected.steps and plan.answer_step == expected.answer_step
        if fmt != "json":
            assert plan.reasoning == " ".join(example["thought"].split())


def test_every_example_program_computes_its_items_gold_answer() -> None:
    """A worked example teaches what it shows: each example's program, run, gives the
    gold answer of the GSM8K train item it is (its `source`)."""
    from evals.datasets import GSM8K_TRAIN

    gold = {}
    for line in GSM8K_TRAIN.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            row = json.loads(line)
            gold[row["id"]] = (row["question"], float(row["answer"]))
    for example in few_shot():
        question, answer = gold[example["source"]]
        assert example["question"] == question
        (step,) = example["plan"]["steps"]
        scope: dict[str, Any] = {}
        exec(step["input"], {}, scope)  # the project's own example data, not model output
        assert abs(scope["result"] - answer) < 1e-9, example["source"]


@pytest.mark.parametrize("shots", [0, 3, 8])
def test_the_prompt_shows_the_first_examples_it_is_asked_for(shots: int) -> None:
    tools = list(DEFAULT_TOOLS)
    messages = build_messages("How many?", tools, fmt="draft", shots=shots)
    assert len(messages) == 2 + 2 * shots
    shown = [m["content"] for m in messages[1:-1:2]]
    assert shown == [e["question"] for e in few_shot()[:shots]]
    # more examples only add to the prompt, after the ones fewer would show
    assert (
        build_messages("How many?", tools, fmt="draft", shots=8)[: 1 + 2 * shots] == messages[:-1]
    )


def test_the_settings_default_is_the_prompts_default() -> None:
    from planner.prompting import DEFAULT_SHOTS

    assert PlannerSettings().few_shot == DEFAULT_SHOTS <= len(few_shot()) == 8


async def test_the_service_shows_the_number_of_examples_its_settings_name() -> None:
    backend = Backend([DRAFT])
    # fewer than the default: a service that ignored its settings would show all eight
    service = await draft_service(backend, few_shot=3)
    await service.plan(PlanRequest(question="How much fruit?"))
    (request,) = backend.requests
    shown = [m["content"] for m in request.messages[1:-1:2]]
    assert shown == [e["question"] for e in few_shot()[:3]]
    assert request.messages[-1]["content"] == "How much fruit?"


def test_transcription_shares_the_draft_prompt_prefix() -> None:
    """The transcription pass differs from the draft pass only in its last message, so
    the engine's cached prefix serves both."""
    tools = list(DEFAULT_TOOLS)
    first = build_messages("How many?", tools, fmt="draft")
    second = transcription_messages("How many?", tools, DRAFT)
    assert second[:-1] == first[:-1]
    assert second[-1]["content"].startswith("How many?") and CODE in second[-1]["content"]


# --------------------------------------------------------------------------- drafts


def test_a_python_draft_is_a_one_step_python_plan() -> None:
    plan = plan_from_draft(DRAFT, NAMES)
    assert plan.reasoning == "She has 3 apples and 4 pears; add them."
    assert [(s.id, s.tool, s.input, s.depends_on) for s in plan.steps] == [
        ("s1", "python", CODE, [])
    ]
    assert plan.answer_step == "s1"


@pytest.mark.parametrize(
    "text",
    [
        f"Add them.\n```python\n{CODE}",  # ran out before the closing fence
        f"Add them.\n```py\n{CODE}\n```\nThis adds the fruit.",  # chat after the code
        f"Add them.\n```python\nresult = 0\n```\nFixed:\n```python\n{CODE}\n```",  # revised
    ],
)
def test_drafts_the_way_models_write_them(text: str) -> None:
    plan = plan_from_draft(text, NAMES)
    assert plan.steps[0].input == CODE and plan.reasoning == "Add them."


@pytest.mark.parametrize(
    ("code", "added"),
    [
        ("a = 3\nb = 4\ntotal = a + b", "result = total"),
        ("total = 3\ntotal += 4", "result = total"),
        ("total: int = 3 + 4", "result = total"),
        ("def solution():\n    a = 3\n    return a + 4", "result = solution()"),
        ("def solution(a=3, *, b=4):\n    return a + b", "result = solution()"),
    ],
)
def test_a_program_that_ends_on_its_answer_unsaid_gets_the_answer_line(
    code: str, added: str
) -> None:
    plan = plan_from_draft(f"Add them.\n```python\n{code}\n```", NAMES)
    assert plan.steps[0].input == f"{code}\n{added}"
    from planner.service import check_python_steps

    check_python_steps(plan)  # the planner takes it at once: no second generation


@pytest.mark.parametrize(
    "code",
    [
        CODE,  # sets result
        "a = 3\na + 4",  # ends with an expression
        "a = 3\nprint(a + 4)",  # prints: the rule reads the printed text
        "a, b = 3, 4",  # no single answer
        "def f(x):\n    return x + 1",  # needs an argument
        "for i in range(3):\n    pass",  # nothing to answer with
        "x: int",  # annotated, never assigned
    ],
)
def test_other_programs_are_left_as_written(code: str) -> None:
    assert with_answer(code) == code


def test_a_json_block_or_a_bare_plan_is_read_as_the_plan() -> None:
    body = {
        "reasoning": "",
        "steps": [{"id": "s1", "tool": "lookup", "input": "capital of France", "depends_on": []}],
        "answer_step": "s1",
    }
    plan = plan_from_draft(f"Look it up.\n```json\n{json.dumps(body)}\n```", NAMES)
    assert plan.steps[0].tool == "lookup" and plan.reasoning == "Look it up."
    assert plan_from_draft(json.dumps(body), NAMES).steps[0].tool == "lookup"


@pytest.mark.parametrize(
    ("text", "names", "why"),
    [
        ("The answer is 7.", NAMES, "no code block"),
        (DRAFT, ["calc", "lookup"], "no python program"),
        (
            '```json\n{"reasoning": "", "steps": [{"id": "s1", "tool": "shell", '
            '"input": "rm -rf /", "depends_on": []}], "answer_step": "s1"}\n```',
            NAMES,
            "unknown tool",
        ),
        ('```json\n{"reasoning": "x", "steps": [}\n```', NAMES, "not valid JSON"),
        ("```python\n" + "x = 1\n" * 1000 + "```", NAMES, "longer than"),
        ("x" * (MAX_DRAFT_CHARS + 1), NAMES, "too long"),
    ],
)
def test_a_draft_without_a_usable_plan_is_refused(text: str, names: list[str], why: str) -> None:
    with pytest.raises(PlanInvalid, match=why):
        plan_from_draft(text, names)


def test_long_thinking_is_cut_to_the_wire_bound_at_a_word() -> None:
    plan = plan_from_draft("word " * 400 + f"\n```python\n{CODE}\n```", NAMES)
    assert len(plan.reasoning) <= PLAN_REASONING_CHARS
    assert plan.reasoning.endswith("word…")


# --------------------------------------------------------------------------- service


class Backend:
    """Answers by the kind of pass: drafts for the first, the prepared programs for a
    prose draft's program pass (none unless given), the prepared JSON for constrained
    passes; keeps every request."""

    name = "fake"
    model = "fake"

    def __init__(
        self, drafts: list[str], plans: list[str] | None = None, programs: list[str] | None = None
    ) -> None:
        self.drafts = drafts
        self.plans = plans or []
        self.programs = programs or []
        self.requests: list[GenerationRequest] = []

    @staticmethod
    def kind(request: GenerationRequest) -> str:
        if request.json_schema is not None:
            return "json"
        return "program" if "program" in request.metadata else "draft"

    async def load(self) -> None: ...

    async def close(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        source = {"draft": self.drafts, "program": self.programs, "json": self.plans}
        return Generation(
            source[self.kind(request)][: request.n], prompt_tokens=10, completion_tokens=5
        )


async def draft_service(backend: Any, **settings: Any) -> PlannerService:
    service = PlannerService(backend, PlannerSettings(plan_format="draft", **settings))
    await service.load()
    return service


async def test_the_draft_format_reads_the_plan_without_a_second_pass() -> None:
    backend = Backend([DRAFT])
    service = await draft_service(backend)
    response = await service.plan(PlanRequest(question="How much fruit?"))
    assert [r.json_schema for r in backend.requests] == [None]
    assert response.plans[0].steps[0].input == CODE
    assert (
        backend.requests[0].messages[0]["content"]
        == build_messages("How much fruit?", list(DEFAULT_TOOLS), fmt="draft")[0]["content"]
    )


async def test_an_unreadable_draft_is_transcribed_under_the_grammar() -> None:
    transcribed = calc_plan("3 + 4")
    backend = Backend(["Three apples and four pears make 3 + 4."], [transcribed], ["no code"])
    service = await draft_service(backend)
    response = await service.plan(PlanRequest(question="How much fruit?"))
    first, _, second = backend.requests
    # a prose draft is asked for its program first; what does not give one is transcribed
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "program", "json"]
    assert first.json_schema is None
    assert second.json_schema == plan_json_schema(NAMES)
    assert second.temperature == 0.0 and second.n == 1
    assert "Three apples and four pears" in second.messages[-1]["content"]
    assert second.messages[:-1] == first.messages[:-1]
    assert response.plans[0].steps[0].tool == "calc"


async def test_n_drafts_are_read_each_and_only_the_unreadable_ones_transcribed() -> None:
    other = DRAFT.replace("apples + pears", "pears + apples")
    backend = Backend(
        [DRAFT, "no code here", other],
        [calc_plan("3 + 4")],
    )
    service = await draft_service(backend)
    response = await service.plan(PlanRequest(question="How much fruit?", n=3))
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "program", "json"]
    assert [p.steps[0].tool for p in response.plans] == ["python", "calc", "python"]


async def test_drafts_that_never_give_a_plan_fail_the_request_after_the_attempts() -> None:
    backend = Backend(["no code"], ["not json either"])
    service = await draft_service(backend, max_attempts=2)
    with pytest.raises(PlanningFailed):
        await service.plan(PlanRequest(question="How much fruit?"))
    # each attempt: one draft, its program pass, one transcription
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "program", "json"] * 2


async def test_a_transcription_the_model_cannot_take_is_one_invalid_candidate() -> None:
    from services.errors import InvalidRequest

    transcribed = calc_plan("3 + 4")

    class TooLong(Backend):
        async def generate(self, request: GenerationRequest) -> Generation:
            if self.kind(request) == "draft":
                return Generation([DRAFT, "no code", "no code either"])
            if self.kind(request) == "program":
                return Generation(["still no code"])
            if request.metadata["transcription"] == 0:
                raise InvalidRequest("the prompt does not fit the context")
            return Generation([transcribed])

    service = await draft_service(TooLong([]), max_attempts=1)
    response = await service.plan(PlanRequest(question="q", n=3, distinct=False))
    assert [p.steps[0].tool for p in response.plans] == ["python", "calc"]


async def test_drafts_too_long_to_transcribe_or_nested_past_the_parser_are_invalid() -> None:
    nested = "```json\n" + "[" * 3000
    backend = Backend(["x" * 9000, nested, DRAFT], [])
    service = await draft_service(backend, max_attempts=1)
    response = await service.plan(PlanRequest(question="q", n=3, distinct=False))
    assert [p.steps[0].input for p in response.plans] == [CODE]
    # the long draft is not pasted into a second prompt; the nested one is transcribed
    first, second = backend.requests
    assert first.json_schema is None and second.json_schema is not None
    assert "[[[" in second.messages[-1]["content"] and "x" * 9000 not in str(second.messages)


async def test_later_samples_are_sampled_even_when_the_default_is_greedy() -> None:
    backend = Backend([DRAFT])
    service = await draft_service(backend, temperature=0.0)
    await service.plan(PlanRequest(question="q", n=1))
    await service.plan(PlanRequest(question="q", n=1, offset=3, distinct=False))
    first, later = backend.requests
    assert first.temperature == 0.0 and later.temperature > 0 and later.first_sample == 3


@pytest.mark.parametrize("failing", ["program", "json"])
async def test_a_failed_second_pass_fails_the_request_and_stops_the_others(failing: str) -> None:
    """A backend failing in a second pass fails the request as it would in the first,
    and the passes still in flight beside it stop. Prose drafts whose program passes
    give no program reach the transcription; a failed program pass ends the request
    before any transcription."""
    import asyncio

    cancelled: list[bool] = []

    class Failing(Backend):
        async def generate(self, request: GenerationRequest) -> Generation:
            kind = self.kind(request)
            if kind == "draft":
                return Generation(["one", "two"])
            if kind != failing:  # a program pass before the failing transcription
                assert kind == "program", "no transcription after a failed program pass"
                return Generation(["no code"])
            if request.metadata["program" if kind == "program" else "transcription"] == 0:
                await asyncio.sleep(0.01)
                raise RuntimeError("engine failed")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return Generation(["{}"])

    service = await draft_service(Failing([]))
    with pytest.raises(RuntimeError, match="engine failed"):
        await service.plan(PlanRequest(question="q", n=2))
    assert cancelled == [True]


async def test_a_draft_is_asked_to_end_where_its_code_block_closes() -> None:
    """The draft pass stops at the closing fence (the engine's own test shows a stop
    ending a sample); the examples the model imitates open their program with a fence
    the stop does not match."""
    backend = Backend([DRAFT])
    service = await draft_service(backend)
    await service.plan(PlanRequest(question="How much fruit?"))
    assert backend.requests[0].stop == ["\n```\n"]
    example = render_example(few_shot()[0], "draft")
    head, _, rest = example.partition("```python\n")
    assert "\n```\n" not in head + "```python\n" and (rest + "\n").count("\n```\n") == 1


@pytest.mark.parametrize(
    "text",
    [
        "```" + " " * 19_990,
        "```json\n" + "[" * 3000,
        '{"a":' + "[" * 3000,
        "```\n" + "\n   " * 4000,
        "```" + " \t" * 9_000 + "\n",
    ],
)
def test_hostile_drafts_are_refused_quickly(text: str) -> None:
    """Linear work on inputs made to make a backtracking reader quadratic (seconds to
    minutes at these sizes). The bound is on this process's CPU time, which another
    job on the machine does not inflate, and leaves room for a slow CPU."""
    import time

    started = time.process_time()
    with pytest.raises(PlanInvalid):
        plan_from_draft(text, NAMES)
    assert time.process_time() - started < 0.25


def test_an_untagged_block_that_parses_as_python_is_the_program() -> None:
    plan = plan_from_draft(f"Add them.\n```\n{CODE}\n```", NAMES)
    assert plan.steps[0].input == CODE
    with pytest.raises(PlanInvalid, match="no python program"):
        plan_from_draft("Add them.\n```\nthree apples plus four pears\n```", NAMES)


PROSE = "She has 3 apples and 4 pears, so she has 3 + 4 = 7 pieces of fruit."


async def test_a_prose_draft_is_asked_for_its_program_which_becomes_the_plan() -> None:
    """A draft that solved the problem in words gets a second, unconstrained pass over
    the same prompt asking for its program; no grammar pass is needed when it gives one."""
    backend = Backend([PROSE], programs=[f"```python\n{CODE}\n```"])
    service = await draft_service(backend)
    response = await service.plan(PlanRequest(question="How much fruit?"))
    first, program = backend.requests
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "program"]
    assert program.messages[:-2] == first.messages
    assert program.messages[-2] == {"role": "assistant", "content": PROSE}
    assert program.messages[-1] == {"role": "user", "content": PROGRAM_REQUEST}
    assert (program.temperature, program.n, program.stop) == (0.0, 1, ["\n```\n"])
    (plan,) = response.plans
    assert [(s.tool, s.input) for s in plan.steps] == [("python", CODE)]
    assert plan.reasoning == PROSE  # the program pass wrote no thinking: the draft's


def test_program_messages_share_the_draft_prompt_prefix() -> None:
    tools = list(DEFAULT_TOOLS)
    first = build_messages("How many?", tools, fmt="draft")
    assert program_messages("How many?", tools, PROSE)[:-2] == first


async def test_a_prose_draft_without_the_python_tool_is_transcribed_directly() -> None:
    calc = next(spec for spec in DEFAULT_TOOLS if spec.name == "calc")
    transcribed = calc_plan("3 + 4")
    backend = Backend([PROSE], [transcribed], [f"```python\n{CODE}\n```"])
    service = await draft_service(backend)
    response = await service.plan(PlanRequest(question="How much fruit?", tools=[calc]))
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "json"]
    assert response.plans[0].steps[0].input == "3 + 4"


async def test_a_program_pass_the_model_cannot_take_falls_back_to_the_transcription() -> None:
    from services.errors import InvalidRequest

    transcribed = calc_plan("3 + 4")

    class TooLong(Backend):
        async def generate(self, request: GenerationRequest) -> Generation:
            if self.kind(request) == "program":
                self.requests.append(request)
                raise InvalidRequest("the prompt does not fit the context")
            return await super().generate(request)

    backend = TooLong([PROSE], [transcribed])
    service = await draft_service(backend, max_attempts=1)
    response = await service.plan(PlanRequest(question="q"))
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "program", "json"]
    assert response.plans[0].steps[0].tool == "calc"


@pytest.mark.parametrize(
    "program",
    [
        "```python\napples = 3\nresult = apples + pears\n```",  # reads a name nothing defines
        "```python\nresult = (3 +\n```",  # not Python
        "```python\nfor i in range(7):\n    pass\n```",  # answers nothing by the tool's rule
    ],
)
async def test_a_program_that_cannot_answer_falls_back_to_the_transcription(program: str) -> None:
    backend = Backend([PROSE], [calc_plan("3 + 4")], [program])
    service = await draft_service(backend, max_attempts=1)
    response = await service.plan(PlanRequest(question="How much fruit?"))
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "program", "json"]
    assert response.plans[0].steps[0].input == "3 + 4"


async def test_the_plan_keeps_the_drafts_thinking_not_the_program_pass_preamble() -> None:
    backend = Backend([PROSE], programs=[f"Here is the program:\n```python\n{CODE}\n```"])
    service = await draft_service(backend)
    (plan,) = (await service.plan(PlanRequest(question="How much fruit?"))).plans
    assert plan.reasoning == PROSE and plan.steps[0].input == CODE


async def test_a_program_pass_may_answer_with_a_json_plan() -> None:
    backend = Backend([PROSE], programs=[f"```json\n{calc_plan('3 + 4')}\n```"])
    service = await draft_service(backend)
    (plan,) = (await service.plan(PlanRequest(question="How much fruit?"))).plans
    assert [Backend.kind(r) for r in backend.requests] == ["draft", "program"]
    assert plan.steps[0].tool == "calc" and plan.reasoning == PROSE


async def test_each_draft_gets_the_plan_of_its_own_second_pass() -> None:
    """Readable drafts, prose drafts whose program pass answers or not, and a draft with
    an unreadable code block, in one generation: every plan lands in its draft's slot."""
    prose_a, prose_b = "Add 1 and 1 to get 2.", "Add 5 and 5 to get 10."
    broken = "```json\n{not a plan"

    class Keyed(Backend):
        async def generate(self, request: GenerationRequest) -> Generation:
            self.requests.append(request)
            kind = self.kind(request)
            if kind == "draft":
                return Generation([DRAFT, prose_a, broken, prose_b])
            if kind == "program":
                draft = request.messages[-2]["content"]
                text = "```python\nresult = 1 + 1\n```" if draft == prose_a else "no code"
                return Generation([text])
            last = request.messages[-1]["content"]
            return Generation([calc_plan("5 + 5" if prose_b in last else "9 + 9")])

    backend = Keyed([])
    service = await draft_service(backend, max_attempts=1)
    response = await service.plan(PlanRequest(question="q", n=4, distinct=False))
    assert [p.steps[0].input for p in response.plans] == [CODE, "result = 1 + 1", "9 + 9", "5 + 5"]
    kinds = [Backend.kind(r) for r in backend.requests]
    assert kinds == ["draft", "program", "program", "json", "json"]


async def test_the_program_pass_is_counted_in_the_requests_cost() -> None:
    from structlog.testing import capture_logs

    backend = Backend([PROSE], programs=[f"```python\n{CODE}\n```"])
    service = await draft_service(backend)
    with capture_logs() as logs:
        await service.plan(PlanRequest(question="How much fruit?"))
    [line] = [e for e in logs if e["event"] == "plans generated"]
    # the fake backend charges 10 prompt and 5 completion tokens a pass: draft + program
    assert line["gen_ai.usage.input_tokens"] == 20
    assert line["gen_ai.usage.output_tokens"] == 10
