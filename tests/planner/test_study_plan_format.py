"""scripts/study_plan_format.py's report: the table counts the items every chosen arm ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.study_plan_format import arm_spec, report

pytestmark = [pytest.mark.unit]


def line(arm: str, item: int, correct: bool) -> dict[str, object]:
    return {
        "arm": arm,
        "mode": arm,
        "id": f"gsm8k-train-{item}",
        "gold": 1,
        "answer": "1" if correct else "2",
        "predicted": 1 if correct else 2,
        "correct": correct,
        "seconds": 1.0,
        "calls": 1,
        "completion_tokens": 10,
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    rows = [line(arm, i, correct=i < 3) for arm in ("json", "draft", "direct") for i in range(6)]
    rows += [line("reasoning", i, correct=True) for i in range(2)]  # an arm stopped early
    path = tmp_path / "study.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_arm_limits_the_table_to_the_items_all_arms_ran(run: Path) -> None:
    table = report([run])
    assert "Items run in every arm: 2." in table
    assert "| reasoning | 2/2 |" in table


def test_chosen_arms_leave_an_arm_stopped_early_out(run: Path) -> None:
    table = report([run], ["json", "draft", "direct"])
    assert "Items run in every arm: 6." in table
    assert "| json | 3/6 |" in table and "| direct | 3/6 |" in table
    assert "reasoning" not in table


def test_an_arm_names_its_format_and_how_many_examples_it_shows() -> None:
    assert arm_spec("draft") == ("draft", None)
    assert arm_spec("draft@8") == ("draft", 8)
    assert arm_spec("json@0") == ("json", 0)
    assert arm_spec("direct") == (None, None)
    for bad in ("drafts", "draft@", "draft@x", "draft@9", "direct@3"):
        with pytest.raises(ValueError):
            arm_spec(bad)


def test_without_direct_the_arms_are_paired_against_the_first(tmp_path: Path) -> None:
    rows = [line("draft", i, correct=i < 3) for i in range(6)]
    rows += [line("draft@8", i, correct=i in (1, 2, 3, 4)) for i in range(6)]
    path = tmp_path / "study.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = report([path], ["draft", "draft@8"])
    assert "vs draft (+rescued / −lost)" in table
    assert "| draft@8 | 4/6 |" in table and "| +2 / −1 |" in table
