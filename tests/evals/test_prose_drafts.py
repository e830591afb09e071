"""`python -m evals.prose_drafts`: drafts in prose only, through the grammar transcription
alone (before) and through the planner's own draft reading (now), executed with the
orchestrator's real tools."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from evals import prose_drafts
from evals.data import Item
from planner.backends.base import Generation, GenerationRequest
from planner.service import PlannerService
from services.settings import PlannerSettings

pytestmark = [pytest.mark.integration]

PROSE = "She has 3 apples and 4 pears, so 3 + 4 = 7 pieces of fruit."


def calc_plan(expression: str) -> str:
    return json.dumps(
        {
            "reasoning": "add",
            "steps": [{"id": "s1", "tool": "calc", "input": expression, "depends_on": []}],
            "answer_step": "s1",
        }
    )


class Backend:
    """The program pass writes the right program; the transcription a wrong plan."""

    name = "fake"
    model = "fake"

    def __init__(self, program: str) -> None:
        self.program = program
        self.kinds: list[str] = []

    async def load(self) -> None: ...

    async def close(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.json_schema is not None:
            self.kinds.append("json")
            return Generation([calc_plan("3 + 3")])
        if "program" in request.metadata:
            self.kinds.append("program")
            return Generation([self.program])
        self.kinds.append("draft")
        return Generation([PROSE, "Add them.\n```python\nresult = 3 + 4\n```"])


async def study(program: str, given: list[str] | None) -> tuple[dict, list[str]]:
    from training.sample_pipeline import make_executor

    backend = Backend(program)
    service = PlannerService(backend, PlannerSettings(plan_format="draft"))
    await service.load()
    item = Item("gsm8k-train-1", "How much fruit?", 7, "7")
    async with AsyncExitStack() as stack:
        executor = await make_executor(stack)
        row = await prose_drafts.study_item(service, executor, item, 2, given)
    return row, backend.kinds


async def test_both_routes_run_on_the_same_prose_draft_and_are_labelled_alike() -> None:
    row, kinds = await study("```python\napples = 3\npears = 4\nresult = apples + pears\n```", None)
    # two drafts drawn; only the prose one is studied (the other has its program)
    assert row["drafts"] == 2 and len(row["prose"]) == 1
    (draft,) = row["prose"]
    assert draft["draft"] == PROSE and draft["sample"] == 0
    assert draft["prose_answer"] == 7 and draft["prose_right"] is True
    assert draft["transcription"]["answer"] == "6" and draft["transcription"]["right"] is False
    assert draft["program"]["right"] is True and draft["program"]["tools"] == ["python"]
    assert draft["program"]["plan"]["reasoning"] == PROSE
    assert kinds == ["draft", "program", "json"]


async def test_given_prose_replaces_the_first_pass_and_a_weak_program_is_transcribed(
    tmp_path: Path,
) -> None:
    row, kinds = await study("```python\nresult = apples + pears\n```", [PROSE])
    assert kinds == ["program", "json", "json"]  # the served route falls back, then before
    (draft,) = row["prose"]
    assert draft["program"]["answer"] == "6" == draft["transcription"]["answer"]
    path = tmp_path / "study.jsonl"
    path.write_text(json.dumps(row) + "\n")
    table = prose_drafts.summary([path])
    assert "questions 1, drafts 1, prose-only drafts 1 (100.0%)" in table
    assert "| grammar transcription (before) | 1 | 1 | 0 |" in table
    assert "the prose's own last number (no plan) | | | 1 |" in table


def test_a_line_with_a_weak_program_counts_as_its_transcription(tmp_path: Path) -> None:
    """Lines written while the planner still kept a program that cannot answer: the
    summary counts what the planner serves now, the draft's transcription."""
    weak = {
        "reasoning": "r",
        "steps": [{"id": "s1", "tool": "python", "input": "result = a", "depends_on": []}],
        "answer_step": "s1",
    }
    route = {"seconds": 1.0, "error": None, "answer": None, "right": False, "plan": weak}
    right = {**route, "answer": "7", "right": True, "plan": json.loads(calc_plan("3 + 4"))}
    line = {
        "id": "q",
        "gold": 7,
        "drafts": 1,
        "model": "m",
        "prose": [
            {
                "sample": 0,
                "draft": PROSE,
                "prose_answer": 7,
                "prose_right": True,
                "transcription": right,
                "program": route,
            }
        ],
    }
    path = tmp_path / "study.jsonl"
    path.write_text(json.dumps(line) + "\n")
    table = prose_drafts.summary([path])
    assert "1 program-route plans cannot answer" in table and "is right 1" in table


def test_reserved_data_is_refused() -> None:
    with pytest.raises(SystemExit):
        prose_drafts.main(["--data", "datasets/gsm8k/test.norm.jsonl", "--out", "x.jsonl"])
