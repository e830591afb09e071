"""Build the planner's chat messages from the prompt files and the offered tools.

A plan format is how the model is asked to write its plan (`PLANNER_PLAN_FORMAT`):

- `json`: the plan as one JSON object under the grammar, its `reasoning` one short
  sentence.
- `reasoning`: the same JSON object, its `reasoning` a few sentences that think the
  problem through before the steps (up to the wire bound).
- `draft`: free text first, the way coder models write: a few sentences of thinking,
  then the program in a python code block. The planner turns the draft into the JSON
  plan itself (`planner.drafts`). A draft in prose only is followed by a second pass that
  asks for its program (`program_messages`); a draft that still gives no plan is
  transcribed into one by a grammar-constrained pass over the same prompt
  (`transcription_messages`).

Whatever the format, the plan on the wire is the same schema-valid JSON DAG.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

from services.schemas import PLAN_REASONING_CHARS, ToolSpec

PlanFormat = Literal["json", "reasoning", "draft"]
PLAN_FORMATS: tuple[PlanFormat, ...] = ("json", "reasoning", "draft")


@dataclass(frozen=True)
class FormatSpec:
    constrained: bool  # the first pass is held to the plan schema
    reasoning_chars: int  # the schema's bound on `reasoning`
    reasoning_rule: str  # what the prompt asks `reasoning` to be (JSON formats)


SHORT_REASONING = "one short sentence on how to get the answer."
LONG_REASONING = (
    "think the problem through first, in a few short sentences: what the question\n"
    "  gives, what it asks for, and each intermediate quantity with how it follows from\n"
    "  the others."
)
FORMATS: dict[PlanFormat, FormatSpec] = {
    "json": FormatSpec(True, 300, SHORT_REASONING),
    "reasoning": FormatSpec(True, PLAN_REASONING_CHARS, LONG_REASONING),
    # a draft's plan keeps its thinking as `reasoning`; the transcription pass is
    # asked for one sentence (the draft already holds the thinking)
    "draft": FormatSpec(False, 300, SHORT_REASONING),
}


def _read(name: str) -> str:
    return resources.files("planner.prompts").joinpath(name).read_text(encoding="utf-8")


@cache
def system_template(fmt: PlanFormat = "json") -> str:
    """The system prompt of a format, with `{tools}` still to fill. Filled with
    `str.replace`: the draft format's text holds JSON braces."""
    if fmt == "draft":
        section, answer_as = _read("format_draft.md"), ""
    else:
        section = _read("format_json.md").replace("{reasoning}", FORMATS[fmt].reasoning_rule)
        answer_as = ", as one JSON object"
    return (
        _read("system.md")
        .replace("{answer_as}", answer_as)
        .replace("{format}", section.rstrip("\n"))
    )


# How many of `fewshot.jsonl`'s worked examples the plan prompt shows, in file order
# (`PLANNER_FEW_SHOT`). The first three are the examples every measured run before the
# few-shot study showed; the five after them are harder GSM8K train items (a percentage
# of a remainder, tiered prices, working backwards, an unknown, a rate with a unit
# change). docs/benchmarks/plan_format.md, "How many worked examples".
DEFAULT_SHOTS = 8


@cache
def few_shot() -> tuple[dict[str, Any], ...]:
    """Every worked example the plan prompt can show (a prompt shows the first
    `shots`). Code that keeps the examples' questions out of sampled or scored data
    excludes all of them."""
    text = _read("fewshot.jsonl")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def render_tools(tools: list[ToolSpec]) -> str:
    lines = []
    for spec in tools:
        lines.append(
            f"- {spec.name}: {spec.description}\n  input: {spec.input_format}"
            + (f"\n  example input: {json.dumps(spec.example)}" if spec.example else "")
        )
    return "\n".join(lines)


def render_example(example: dict[str, Any], fmt: PlanFormat) -> str:
    """A few-shot example's answer in the format the model is asked to write."""
    plan = example["plan"]
    if fmt == "json":
        return json.dumps(plan)
    if fmt == "reasoning":
        return json.dumps({**plan, "reasoning": example["thought"]})
    steps = plan["steps"]
    if len(steps) == 1 and steps[0]["tool"] == "python":
        return f"{example['thought']}\n\n```python\n{steps[0]['input']}\n```"
    return f"{example['thought']}\n\n```json\n{json.dumps(plan)}\n```"


def build_messages(
    question: str,
    tools: list[ToolSpec],
    feedback: str | None = None,
    fmt: PlanFormat = "json",
    shots: int = DEFAULT_SHOTS,
) -> list[dict[str, str]]:
    names = {t.name for t in tools}
    system = system_template(fmt).replace("{tools}", render_tools(tools))
    messages = [{"role": "system", "content": system}]
    for example in few_shot()[:shots]:
        # Only show examples whose tools are all offered.
        if all(step["tool"] in names for step in example["plan"]["steps"]):
            messages.append({"role": "user", "content": example["question"]})
            messages.append({"role": "assistant", "content": render_example(example, fmt)})
    content = question
    if feedback:
        content = f"{question}\n\nA previous attempt failed:\n{feedback}\nWrite a corrected plan."
    messages.append({"role": "user", "content": content})
    return messages


def transcription_messages(
    question: str,
    tools: list[ToolSpec],
    draft: str,
    feedback: str | None = None,
    shots: int = DEFAULT_SHOTS,
) -> list[dict[str, str]]:
    """The draft format's second pass: the same prompt (so the same cached prefix), the
    question followed by the model's own draft, answered with the JSON plan under the
    grammar."""
    messages = build_messages(question, tools, feedback, "draft", shots)
    messages[-1]["content"] += (
        f"\n\nA draft of the solution:\n{draft}\n\n"
        'Write the plan for this draft as one JSON object with "reasoning", "steps" and '
        '"answer_step".'
    )
    return messages


# The program pass's request, after a draft that solved the problem in words only. It
# repeats the system prompt's own rule for a word problem's program.
PROGRAM_REQUEST = (
    "Now write the plan's program for this solution in one ```python block, then stop: "
    "every number of the question in a variable with a meaningful name, each "
    "intermediate quantity on its own line, and the last line `result = <final answer>`."
)


def program_messages(
    question: str,
    tools: list[ToolSpec],
    draft: str,
    feedback: str | None = None,
    shots: int = DEFAULT_SHOTS,
) -> list[dict[str, str]]:
    """The draft format's program pass, for a draft written in prose only: the same
    prompt (so the same cached prefix), the model's draft as its own answer, then the
    request for that solution's program. What it writes is read as a draft again."""
    messages = build_messages(question, tools, feedback, "draft", shots)
    messages.append({"role": "assistant", "content": draft})
    messages.append({"role": "user", "content": PROGRAM_REQUEST})
    return messages
