"""The planner comparison report (`training.planner_eval`): accuracy, plans made, void
steps and latency per arm over the questions both arms answered, and the paired counts
against the first arm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.test_planner_data import sample, step
from training import planner_eval

pytestmark = [pytest.mark.unit]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def timed(row: dict, seconds: float, model: str) -> dict:
    return {**row, "seconds": seconds, "model": model}


def test_arms_are_compared_on_their_common_questions(tmp_path: Path) -> None:
    ok = [step("s1", "result = 1")]
    void = [step("s1", "x = 3"), step("s2", "result = 1")]
    base = write(
        tmp_path / "base.jsonl",
        [
            timed(sample("q1", 0, ok), 2.0, "m"),
            timed(sample("q2", 0, ok, right=False), 4.0, "m"),
            timed(sample("q3", 0, [], right=False), 6.0, "m"),  # no plan: no answer
            timed(sample("q4", 0, ok), 1.0, "m"),  # only in this arm: left out
        ],
    )
    lora = write(
        tmp_path / "lora.jsonl",
        [
            timed(sample("q1", 0, ok), 3.0, "m+lora"),
            timed(sample("q2", 0, void, answer="s2"), 4.0, "m+lora"),
            timed(sample("q3", 0, ok), 5.0, "m+lora"),
        ],
    )
    report = planner_eval.compare([base, lora])
    assert report["common_questions"] == 3
    a, b = report["arms"]
    assert (a["model"], a["right"], a["with_plan"], a["void_steps_per_plan"]) == ("m", 1, 2, 0.0)
    assert (b["model"], b["right"], b["with_plan"]) == ("m+lora", 3, 3)
    assert b["void_steps_per_plan"] == pytest.approx(1 / 3, abs=1e-4)
    assert b["plans_with_void_steps"] == 1
    assert (a["seconds_p50"], b["seconds_p50"]) == (4.0, 4.0)
    against = report["against_first"][0]
    assert (against["only_first_right"], against["only_this_right"]) == (0, 2)
    assert against["points"] == pytest.approx(66.67, abs=0.01)
    assert against["mcnemar_p"] == 0.5 and against["seconds_p50_ratio"] == 1.0


def test_missing_files_are_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        planner_eval.main([str(tmp_path / "none.jsonl")])
