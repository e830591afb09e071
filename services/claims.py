"""The claim the verifier judges: how it is written, read back and rendered as a prompt.

A claim is `{"question", "statement", "context"}` (the `/verify` request). The statement
is always `The answer is <answer>.`; the context shows the work behind the answer, in one
of two forms:

- an executed plan: its reasoning, then one line per step, then the answer step,

      Plan: multiply then double
      Steps:
      s1 [calc] '17*23+4' -> '395'
      s2 [python] 's1 * 2' -> '790'
      answer_step: s2

  where the input and output are Python string literals (so a multi-line program stays
  on one line) and a step that did not succeed shows its status instead of an output
  (`s3 [sql] 'SELECT ...' -> timeout`);
- a chain-of-thought solution: `Worked solution:` and the solution's text.

The orchestrator writes claims with `plan_claim` / `solution_claim`, `training.data`
writes its GSM8K claims with the same functions, and the verifier's symbolic checks read
the step form back with `parse_steps`, defined here beside the writer. The verifier model
sees a claim as the text `render_prompt` makes from it, in the format the adapter was
trained on (`PROMPT_FORMAT`, saved beside the adapter as `prompt.json`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from services.schemas import MAX_CONTEXT_CHARS, MAX_QUESTION_CHARS

FIELD_CHARS = 2000  # a step's input or output is cut to this first: the context is cut anyway
SOLUTION_HEADER = "Worked solution:\n"
_SUCCESS = ("ok", "fallback")


class WorkStep(Protocol):
    """What a claim shows of one executed step (`services.schemas.StepResult` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def input(self) -> str: ...
    @property
    def output(self) -> str | None: ...
    @property
    def status(self) -> str: ...


@dataclass(frozen=True)
class Step:
    """A step as a claim states it: also what `parse_steps` reads back."""

    id: str
    tool: str
    input: str
    output: str | None
    status: str = "ok"


# --------------------------------------------------------------------------- writing


def statement(answer: str | None) -> str:
    return f"The answer is {answer}."


def _cut(text: str | None, limit: int = FIELD_CHARS) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit] + "…"


def _step_line(step: WorkStep) -> str:
    if step.status in _SUCCESS:
        return f"{step.id} [{step.tool}] {_cut(step.input)!r} -> {_cut(step.output)!r}"
    return f"{step.id} [{step.tool}] {_cut(step.input)!r} -> {step.status}"


def plan_context(reasoning: str, steps: Iterable[WorkStep], answer_step: str) -> str:
    """The work of an executed plan, in the step form above, cut to the context limit."""
    lines = [f"Plan: {reasoning}", "Steps:", *(_step_line(s) for s in steps)]
    lines.append(f"answer_step: {answer_step}")
    return "\n".join(lines)[:MAX_CONTEXT_CHARS]


def solution_context(text: str) -> str:
    return f"{SOLUTION_HEADER}{text}"[:MAX_CONTEXT_CHARS]


def answer_claim(question: str, answer: str | None, context: str = "") -> dict[str, str]:
    """The claim that `answer` answers `question`, with `context` (one of the two forms
    above, or none) as the work shown."""
    return {
        "question": question[:MAX_QUESTION_CHARS],
        "statement": statement(answer),
        "context": context[:MAX_CONTEXT_CHARS],
    }


def plan_claim(
    question: str, answer: str | None, reasoning: str, steps: Iterable[WorkStep], answer_step: str
) -> dict[str, str]:
    """The claim for an executed plan's answer."""
    return answer_claim(question, answer, plan_context(reasoning, steps, answer_step))


def solution_claim(question: str, answer: str | None, text: str) -> dict[str, str]:
    """The claim for a chain-of-thought solution's answer."""
    return answer_claim(question, answer, solution_context(text))


# --------------------------------------------------------------------------- reading

_STEP_RE = re.compile(
    r"^(?P<id>s\d{1,2})\s*\[(?P<tool>[a-z][a-z0-9_]*)\]\s*"
    r"(?P<input>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|.*?)\s*->\s*(?P<output>.*)$"
)
_ANSWER_STEP_RE = re.compile(r"^answer_step:\s*(?P<id>s\d{1,2})\s*$")


def _unquote(text: str) -> str | None:
    """A step field as written: bare, or quoted as a Python string literal (`'17*23'`)."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        return value if isinstance(value, str) else None
    return text


def parse_steps(context: str) -> tuple[list[Step], str] | None:
    """The steps of a context in the step form and its answer step id, or None when the
    context is not in that form.

    Lines before a `Steps:` line (the plan's reasoning) are skipped; after it (or from the
    start when there is none) every line is a step or `answer_step: sN` (without one, the
    last step is the answer step). Hand-written contexts may leave inputs and outputs
    unquoted (`s1 [calc] 17*23+4 -> 395`); a step shown with its status instead of an
    output is read with the status as its output.
    """
    lines = [line.strip() for line in context.strip().splitlines()]
    lowered = [line.lower() for line in lines]
    if "steps:" in lowered:
        lines = lines[lowered.index("steps:") + 1 :]
    steps: list[Step] = []
    answer_step = None
    for line in lines:
        if not line:
            continue
        m = _ANSWER_STEP_RE.match(line)
        if m:
            answer_step = m["id"]
            continue
        m = _STEP_RE.match(line)
        if not m:
            return None
        step_input, output = _unquote(m["input"]), _unquote(m["output"])
        if step_input is None or output is None:
            return None
        steps.append(Step(m["id"], m["tool"], step_input, output))
    if not steps:
        return None
    ids = [s.id for s in steps]
    if len(set(ids)) != len(ids) or (answer_step is not None and answer_step not in ids):
        return None
    return steps, answer_step or steps[-1].id


# --------------------------------------------------------------------------- the prompt

PROMPT_FORMAT: dict[str, Any] = {
    "version": 1,
    "header": "Is the claim TRUE or FALSE given the question and context?\n",
    "question_block": "Question: {question}\n",
    "context_block": "Context:\n{context}\n",
    "claim_block": "Claim: {statement}\nVerdict:",
    # The two answers compared at the last position; only their first tokens count.
    "true_text": " TRUE",
    "false_text": " FALSE",
}


def render_prompt(
    statement: str,
    context: str = "",
    question: str | None = None,
    fmt: Mapping[str, Any] = PROMPT_FORMAT,
) -> str:
    """The verifier model's prompt for one claim, in format `fmt` (no trailing space: the
    answer token carries it)."""
    parts = [fmt["header"]]
    if question and question.strip():
        parts.append(fmt["question_block"].format(question=question.strip()))
    if context and context.strip():
        parts.append(fmt["context_block"].format(context=context.strip()))
    parts.append(fmt["claim_block"].format(statement=statement.strip()))
    return "".join(parts)


# A step's value as responses and the verifier's claims show it.
STEP_OUTPUT_CHARS = 20_000


def render_value(value: Any) -> str:
    """How a step's value is shown in responses and prompts."""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= STEP_OUTPUT_CHARS else text[:STEP_OUTPUT_CHARS] + "…"
