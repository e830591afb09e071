"""A deterministic planner backend for tests and for running without a model.

Plans come from a script (question -> list of plan JSON texts) when one is configured;
otherwise an arithmetic expression found in the question becomes a one-step `calc` plan
and anything else becomes a one-step `lookup` plan. Same question, same plan.
Chain-of-thought solutions (`/solve`) come from the `prose` script (question -> texts, the
k-th sample the k-th text, the last one repeating); without one, a text with no answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from planner.backends.base import Generation, GenerationRequest

NO_SOLUTION = "The scripted planner has no worked solution for this question."
_EXPR_RE = re.compile(r"[-+(]*\s*\d[\d.,]*\s*(?:[-+*/^x×÷%]\s*[-+(]*\s*\d[\d.,]*\s*\)*\s*)+")


class ScriptedBackend:
    name = "scripted"

    def __init__(
        self,
        script: dict[str, Any] | None = None,
        script_path: Path | None = None,
        prose: dict[str, str | list[str]] | None = None,
    ):
        self.model = "scripted"
        self._script = dict(script or {})
        self._script_path = script_path
        self._prose = dict(prose or {})

    async def load(self) -> None:
        if self._script_path is not None:
            self._script.update(json.loads(self._script_path.read_text()))

    async def close(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> Generation:
        question = request.question.strip()
        if request.metadata.get("kind") == "prose":
            texts = self._prose.get(question) or [NO_SOLUTION]
            texts = [texts] if isinstance(texts, str) else texts
            first = request.first_sample
            return Generation([texts[min(first + i, len(texts) - 1)] for i in range(request.n)])
        scripted = self._script.get(question)
        if scripted is not None:
            texts = scripted if isinstance(scripted, list) else [scripted]
            texts = [t if isinstance(t, str) else json.dumps(t) for t in texts]
            # Attempt k of a retry loop gets the k-th scripted text (the last one repeats).
            attempt = int(request.metadata.get("attempt", 0))
            start = min(attempt, len(texts) - 1)
            return Generation([texts[min(start + i, len(texts) - 1)] for i in range(request.n)])
        return Generation([json.dumps(default_plan(question))] * request.n)


def default_plan(question: str) -> dict[str, Any]:
    match = max(_EXPR_RE.findall(question), key=len, default="")
    if match.strip():
        expr = match.strip().replace("x", "*").replace("×", "*").replace("÷", "/")
        return {
            "reasoning": "The question is an arithmetic expression; compute it exactly.",
            "steps": [{"id": "s1", "tool": "calc", "input": expr, "depends_on": []}],
            "answer_step": "s1",
        }
    return {
        "reasoning": "Look the fact up in the knowledge base.",
        "steps": [{"id": "s1", "tool": "lookup", "input": question[:600], "depends_on": []}],
        "answer_step": "s1",
    }
