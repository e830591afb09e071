"""The xgrammar constraint of the llama.cpp backend, on SmolLM2-135M's real vocabulary.

The processor is driven by hand here, the way llama-cpp-python drives it (all token ids so
far, then the logits of the next step), so each property is checked directly: the mask
allows exactly the tokens that keep the text inside the schema, the stop tokens only once
the JSON is complete, control tokens never; a token outside the grammar is reported, not
swallowed, and ends the generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cli.pull import pull

pytest.importorskip("llama_cpp")
pytest.importorskip("xgrammar")

pytestmark = [pytest.mark.model]

SCHEMA = {
    "type": "object",
    "properties": {"tool": {"type": "string", "enum": ["calc", "python"]}},
    "required": ["tool"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm() -> Iterator[Any]:
    from services.llamacpp import open_llama, use_extra_buffers

    path = pull("smollm2-135m-instruct")
    model = open_llama(
        path, extra_buffers=use_extra_buffers("auto"), n_ctx=256, n_threads=1, verbose=False
    )
    yield model
    model.close()


@pytest.fixture(scope="module")
def constraint(llm: Any) -> Any:
    from planner.backends.schema_constraint import SchemaConstraint

    return SchemaConstraint(llm)


def tokens(llm: Any, text: str) -> list[int]:
    return llm.tokenize(text.encode(), add_bos=False, special=False)


def allowed_after(
    constraint: Any, prompt: list[int], generated: list[int], schema: dict[str, Any] = SCHEMA
) -> np.ndarray:
    """Token ids the processor leaves open after `generated`, replayed call by call."""
    processor = constraint.processor(constraint.compile(schema))
    scores = processor(np.array(prompt), np.zeros(constraint.vocab_size, dtype=np.float32))
    for i in range(len(generated)):
        scores = processor(np.array(prompt + generated[: i + 1]), np.zeros_like(scores))
    assert processor.error is None
    return np.flatnonzero(np.isfinite(scores))


def test_vocabulary_marks_control_tokens_and_stops(llm: Any) -> None:
    from planner.backends.schema_constraint import vocabulary

    pieces, stops = vocabulary(llm)
    assert len(pieces) == llm.n_vocab()
    assert llm.token_eos() in stops
    assert pieces[llm.token_eos()] == b""  # <|im_end|> is a control token: never plan text
    (brace,) = tokens(llm, "{")
    assert pieces[brace] == b"{"
    (spaced,) = tokens(llm, " the")
    assert pieces[spaced] == b" the"  # byte-level BPE decoded to its bytes


def test_first_step_allows_only_an_opening_brace(llm: Any, constraint: Any) -> None:
    prompt = tokens(llm, "Answer in JSON:")
    allowed = allowed_after(constraint, prompt, [])
    assert len(allowed) > 0
    for token in allowed:
        text = llm.detokenize([int(token)]).decode("utf-8", errors="replace")
        assert text.startswith("{"), text
    assert llm.token_eos() not in allowed


def test_enum_and_stop_tokens(llm: Any, constraint: Any) -> None:
    prompt = tokens(llm, "Answer in JSON:")
    head = tokens(llm, '{"tool": "')
    allowed = {int(t) for t in allowed_after(constraint, prompt, head)}
    assert allowed
    texts = {llm.detokenize([t]).decode("utf-8", errors="replace") for t in allowed}
    assert all("calc".startswith(t) or "python".startswith(t) for t in texts), texts
    complete = tokens(llm, json.dumps({"tool": "calc"}))
    after = {int(t) for t in allowed_after(constraint, prompt, complete)}
    assert after and after <= set(constraint.stop_token_ids)


# `input` carries code (escapes allowed, length left to validation); `note` is free text
# (bounded by the grammar).
BOUNDED = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "minLength": 1, "maxLength": 12},
        "note": {"type": "string", "maxLength": 5},
    },
    "required": ["input"],
    "additionalProperties": False,
}


def accepts(constraint: Any, schema: dict[str, Any], text: str) -> bool:
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(constraint.compile(schema))
    # The whole text, then a stop token: only a complete value of the schema takes both.
    return bool(matcher.accept_string(text)) and bool(
        matcher.accept_token(constraint.stop_token_ids[0])
    )


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (r"a = 1\nb = 2", True),  # a newline escape inside a length-bounded string
        (r"say \"hi\"", True),
        (r"back\\slash", True),
        (r"tab\tu\u00e9", True),
        (r"bad \x escape", False),  # not a JSON escape
        ("trailing \\", False),  # a lone backslash before the closing quote
    ],
)
def test_code_fields_take_json_escapes(constraint: Any, value: str, ok: bool) -> None:
    """xgrammar alone forbids every escape in a length-bounded string, so python code in a
    plan could not have a second line; the code fields take JSON's escapes, and only
    those."""
    text = '{"input": "' + value + '"}'
    assert accepts(constraint, BOUNDED, text) is ok
    if ok:
        json.loads(text)


def test_code_field_lengths_are_left_to_validation(constraint: Any) -> None:
    """The grammar does not count a code field's characters; `max_tokens` bounds a
    completion and plan validation checks the plan's own limits exactly."""
    from services.errors import PlanInvalid
    from services.plans import parse_plan
    from services.schemas import MAX_STEP_INPUT_CHARS
    from services.toolspecs import tool_names

    assert accepts(constraint, BOUNDED, json.dumps({"input": "x" * 40}))
    plan = {
        "reasoning": "r",
        "steps": [
            {
                "id": "s1",
                "tool": "calc",
                "input": "1+" * (MAX_STEP_INPUT_CHARS // 2) + "1",
                "depends_on": [],
            }
        ],
        "answer_step": "s1",
    }
    with pytest.raises(PlanInvalid):
        parse_plan(json.dumps(plan), tool_names())


def test_min_length_still_holds(constraint: Any) -> None:
    assert not accepts(constraint, BOUNDED, '{"input": ""}')
    assert accepts(constraint, BOUNDED, '{"input": "x"}')
    assert accepts(constraint, BOUNDED, '{"input": "\\n"}')  # one escaped character


def test_control_tokens_stay_out_of_strings(llm: Any, constraint: Any) -> None:
    prompt = tokens(llm, "Answer in JSON:")
    head = tokens(llm, '{"input": "a')
    allowed = set(allowed_after(constraint, prompt, head, BOUNDED).tolist())
    im_start = llm.tokenize(b"<|im_start|>", add_bos=False, special=True)
    assert len(im_start) == 1 and im_start[0] not in allowed
    assert tokens(llm, " b")[0] in allowed


def test_free_text_stays_bounded(constraint: Any) -> None:
    """Other strings keep the schema's maxLength, so free text cannot run on."""
    assert accepts(constraint, BOUNDED, '{"input": "x", "note": "short"}')
    assert not accepts(constraint, BOUNDED, '{"input": "x", "note": "longer"}')


def test_the_plan_schema_bounds_reasoning_and_frees_step_inputs(constraint: Any) -> None:
    from services.schemas import plan_json_schema
    from services.toolspecs import tool_names

    schema = plan_json_schema(tool_names())
    code = "a = 1\nb = 2\nresult = a + b"

    def plan(reasoning: str, code: str) -> str:
        step = {"id": "s1", "tool": "python", "input": code, "depends_on": []}
        return json.dumps({"reasoning": reasoning, "steps": [step], "answer_step": "s1"})

    assert accepts(constraint, schema, plan("Add.", code))
    assert accepts(constraint, schema, plan("Add.", "x = 1\n" * 200))  # past maxLength 600
    assert not accepts(constraint, schema, plan("r" * 301, code))  # reasoning maxLength 300


@pytest.mark.parametrize("raw", ["\n", "\t", "\x00", "\x1f"])
def test_raw_control_characters_stay_out_of_strings(constraint: Any, raw: str) -> None:
    assert not accepts(constraint, BOUNDED, '{"input": "a' + raw + 'b"}')
    escaped = json.dumps(raw)[1:-1]  # the same character as a JSON escape is fine
    assert accepts(constraint, BOUNDED, '{"input": "a' + escaped + 'b"}')


def test_a_token_outside_the_grammar_is_reported_and_ends_generation(
    llm: Any, constraint: Any
) -> None:
    processor = constraint.processor(constraint.compile(SCHEMA))
    prompt = tokens(llm, "Answer in JSON:")
    scores = np.zeros(constraint.vocab_size, dtype=np.float32)
    processor(np.array(prompt), scores.copy())
    outside = tokens(llm, "hello")[:1]
    masked = processor(np.array(prompt + outside), scores.copy())
    assert processor.error is not None and "outside the grammar" in str(processor.error)
    assert set(np.flatnonzero(np.isfinite(masked))) == set(constraint.stop_token_ids)


def test_a_schema_xgrammar_cannot_compile_raises(constraint: Any) -> None:
    from planner.backends.schema_constraint import ConstraintError

    with pytest.raises(ConstraintError, match="cannot compile"):
        constraint.compile({"type": "string", "pattern": "(unclosed"})


def test_backend_fails_and_logs_a_completion_whose_constraint_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A matcher failure inside llama.cpp's sampler callback must not let decoding run on
    unconstrained: the completion stops at once, the failure is logged and the request
    fails with `constraint_failed` (503), not as the model's mistake."""
    import asyncio

    from structlog.testing import capture_logs

    from planner.backends.base import GenerationRequest
    from planner.backends.llamacpp import LlamaCppBackend
    from services.settings import PlannerSettings

    backend = LlamaCppBackend(
        PlannerSettings(backend="llamacpp", model="smollm2-135m-instruct", n_ctx=512, n_threads=1),
        batching=False,  # the sequential path, where the processor runs
    )
    # 50 integers: far more tokens than the failure below allows.
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 50, "maxItems": 50}
    request = GenerationRequest(
        messages=[{"role": "user", "content": "List fifty numbers."}],
        json_schema=schema,
        max_tokens=300,
    )

    async def scenario() -> str:
        await backend.load()
        try:
            assert backend._constraint is not None
            make = backend._constraint.processor

            def failing(compiled: Any) -> Any:
                processor = make(compiled)
                advance = processor._advance
                calls = []

                def advance_then_fail(input_ids: Any) -> None:
                    calls.append(1)
                    if len(calls) > 3:
                        raise RuntimeError("matcher state lost")
                    advance(input_ids)

                processor._advance = advance_then_fail
                return processor

            monkeypatch.setattr(backend._constraint, "processor", failing)
            return (await backend.generate(request)).texts[0]
        finally:
            await backend.close()

    from planner.backends.schema_constraint import ConstraintError

    with capture_logs() as logs, pytest.raises(ConstraintError) as failed:
        asyncio.run(scenario())
    assert failed.value.status_code == 503 and "matcher state lost" in failed.value.message
    failures = [e for e in logs if e["event"] == "constrained decoding failed"]
    assert failures and "matcher state lost" in failures[0]["error.message"]
    assert len(failures) == 1


def test_batch_engine_fails_only_the_job_whose_matcher_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In the batch engine a matcher that fails mid-way ends its own request with
    `constraint_failed` (503), logged once; a request decoding beside it goes on."""
    import asyncio

    import xgrammar
    from structlog.testing import capture_logs

    from planner.backends.base import GenerationRequest
    from planner.backends.llamacpp import LlamaCppBackend
    from planner.backends.schema_constraint import ConstraintError
    from services.settings import PlannerSettings

    backend = LlamaCppBackend(
        PlannerSettings(backend="llamacpp", model="smollm2-135m-instruct", n_ctx=512, n_threads=1)
    )
    numbers = {"type": "array", "items": {"type": "integer"}, "minItems": 50, "maxItems": 50}
    doomed = GenerationRequest(
        messages=[{"role": "user", "content": "List fifty numbers."}],
        json_schema=numbers,
        max_tokens=300,
    )
    healthy = GenerationRequest(
        messages=[{"role": "user", "content": "Say yes."}],
        json_schema={"type": "string", "enum": ["yes"]},
        max_tokens=20,
    )
    real = xgrammar.GrammarMatcher
    made: list[object] = []

    class FailingMatcher:
        """The first matcher made (the doomed request is admitted first) fails."""

        def __init__(self, compiled: Any) -> None:
            self._inner = real(compiled)
            self._fail = not made
            made.append(self)
            self._accepted = 0

        def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> Any:
            return self._inner.fill_next_token_bitmask(bitmask, index)

        def accept_token(self, token: int) -> bool:
            self._accepted += 1
            if self._fail and self._accepted > 3:
                raise RuntimeError("matcher state lost")
            return bool(self._inner.accept_token(token))

    async def scenario() -> tuple[BaseException | Any, Any]:
        await backend.load()
        try:
            monkeypatch.setattr(xgrammar, "GrammarMatcher", FailingMatcher)
            failed, ok = await asyncio.gather(
                backend.generate(doomed), backend.generate(healthy), return_exceptions=True
            )
            return failed, ok
        finally:
            await backend.close()

    with capture_logs() as logs:
        failed, ok = asyncio.run(scenario())
    assert isinstance(failed, ConstraintError)
    assert failed.status_code == 503 and "matcher state lost" in failed.message
    assert not isinstance(ok, BaseException) and ok.texts == ['"yes"']
    failures = [e for e in logs if e["event"] == "constrained decoding failed"]
    assert len(failures) == 1 and "matcher state lost" in failures[0]["error.message"]
