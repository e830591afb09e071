"""Build the planner's chat messages from the prompt files and the offered tools."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from services.schemas import ToolSpec


@cache
def system_template() -> str:
    return resources.files("planner.prompts").joinpath("system.md").read_text(encoding="utf-8")


@cache
def few_shot() -> tuple[dict[str, Any], ...]:
    text = resources.files("planner.prompts").joinpath("fewshot.jsonl").read_text(encoding="utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def render_tools(tools: list[ToolSpec]) -> str:
    lines = []
    for spec in tools:
        lines.append(
            f"- {spec.name}: {spec.description}\n  input: {spec.input_format}"
            + (f"\n  example input: {json.dumps(spec.example)}" if spec.example else "")
        )
    return "\n".join(lines)


def build_messages(
    question: str, tools: list[ToolSpec], feedback: str | None = None
) -> list[dict[str, str]]:
    names = {t.name for t in tools}
    messages = [{"role": "system", "content": system_template().format(tools=render_tools(tools))}]
    for example in few_shot():
        # Only show examples whose tools are all offered.
        if all(step["tool"] in names for step in example["plan"]["steps"]):
            messages.append({"role": "user", "content": example["question"]})
            messages.append({"role": "assistant", "content": json.dumps(example["plan"])})
    content = question
    if feedback:
        content = f"{question}\n\nA previous attempt failed:\n{feedback}\nWrite a corrected plan."
    messages.append({"role": "user", "content": content})
    return messages
