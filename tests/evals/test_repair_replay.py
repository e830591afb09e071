"""`python -m evals.repair`: sampled plans replayed with the orchestrator's real tools, as
written and as the planner repairs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals import repair

pytestmark = [pytest.mark.integration]


def sample(qid: str, k: int, steps: list[tuple[str, list[str]]], gold: float) -> dict:
    return {
        "id": qid,
        "kind": "plan",
        "sample": k,
        "gold": gold,
        "plan": {
            "reasoning": "r",
            "steps": [
                {"id": f"s{i}", "tool": "python", "input": code, "depends_on": deps}
                for i, (code, deps) in enumerate(steps, start=1)
            ],
            "answer_step": f"s{len(steps)}",
        },
    }


def test_the_replay_counts_what_the_repair_changes(tmp_path: Path, capsys) -> None:
    rows = [
        # cut into steps: fails as written, answers 50 repaired
        sample("q1", 0, [("cards = 200", []), ("cards / 4", ["s1"])], 50),
        # whole: the same answer both ways
        sample("q1", 1, [("result = 200 / 4", [])], 50),
        sample("q2", 0, [("result = 7 * 3", [])], 20),  # wrong both ways
        {"id": "q2", "kind": "prose", "sample": 0, "gold": 20, "plan": None},
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "counts.json"
    assert repair.main([str(path), "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    assert result["plans"] == {
        "plans": 3,
        "repaired": 1,
        "written_answered": 2,
        "written_right": 1,
        "repaired_answered": 3,
        "repaired_right": 2,
    }
    assert result["first_plans"]["questions"] == 2
    assert result["first_plans"]["written_right"] == 0
    assert result["first_plans"]["repaired_right"] == 1
    assert result["changed"] == [{"id": "q1", "sample": 0, "right_after": True}]
    assert "| samples.jsonl (every plan) | 3 | 1 | 2 → 3 | 1 → 2 |" in capsys.readouterr().out
