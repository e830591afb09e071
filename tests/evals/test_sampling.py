"""The served votes' breakdown on synthetic results whose votes are known by construction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals.report import write_report
from evals.sampling import agreement_band, sampling_analysis, sampling_markdown

pytestmark = pytest.mark.unit


def voted(
    item: str, gold: int, served: str | None, answers: list[str | None], *, error: str | None = None
) -> dict[str, Any]:
    agreeing = sum(a == served for a in answers) if served is not None else 0
    return {
        "id": item,
        "dataset": "gsm8k-test",
        "mode": "plan+verify+mixed7",
        "gold": gold,
        "answer_text": served,
        "correct": served is not None and float(served) == gold,
        "error": error,
        "agreement": {
            "plans": len(answers),
            "agreeing": agreeing,
            "rounds": 1,
            "votes": [
                {"source": "plan" if k % 2 == 0 else "prose", "answer": a}
                for k, a in enumerate(answers)
            ],
        },
    }


def records() -> list[dict[str, Any]]:
    return [
        # stage one agreed, right
        voted("q0", 18, "18", ["18", "18"]),
        # stage one agreed, wrong: nothing right among the samples
        voted("q1", 5, "6", ["6", "6"]),
        # seven drawn; the right answer had two votes, the served one three: missed
        voted("q2", 72, "70", ["70", "72", "70", "72", "70", "1", None]),
        # seven drawn, right with four of seven
        voted("q3", 10, "10", ["10", "10", "9", "10", "10", "3", "4"]),
        # cut at four, no sample right; a "$12.00" answer text is read as a number
        voted("q4", 12, "11", ["11", "13", "11", "14"]),
        # a right sample written with units still counts as right
        voted("q5", 12, "11", ["11", "$12.00", "11", "14"]),
        # a failed request and a single-plan item record no votes
        {**voted("q6", 1, None, []), "error": "504 deadline", "agreement": None},
        {"id": "q7", "dataset": "gsm8k-test", "mode": "plan+verify+mixed7", "correct": True},
        # another mode without votes gets no report, nor one whose items voted alone (a
        # single plan that was replanned records its one vote)
        {"id": "q0", "dataset": "gsm8k-test", "mode": "direct", "correct": True, "gold": 18},
        {**voted("q0", 18, None, [None]), "mode": "plan"},
    ]


def test_wrong_answers_split_into_missed_and_none_right() -> None:
    (rep,) = sampling_analysis(records())
    assert (rep.dataset, rep.mode) == ("gsm8k-test", "plan+verify+mixed7")
    assert rep.items == 6 and rep.without_votes == 2
    assert rep.right == 2  # q0, q3
    assert rep.missed == 2  # q2, q5
    assert rep.none_right == 2  # q1, q4
    assert rep.any_right == 4
    assert rep.right + rep.missed + rep.none_right == rep.items
    assert rep.mean_drawn == pytest.approx((2 + 2 + 7 + 7 + 4 + 4) / 6)
    assert {k: (t.items, t.right) for k, t in rep.by_drawn.items()} == {
        2: (2, 1),
        7: (2, 1),
        4: (2, 0),
    }
    bands = {b: (t.items, t.right) for b, t in rep.by_agreement.items()}
    # q0, q1 all agree; q3 four of seven; q2 three of seven, q4, q5 two of four
    assert bands == {"all": (2, 1), "more than half": (1, 1), "half or less": (3, 0)}


def test_agreement_bands() -> None:
    assert agreement_band(2, 2) == "all"
    assert agreement_band(4, 7) == "more than half"
    assert agreement_band(2, 4) == "half or less"
    assert agreement_band(0, 7) == "half or less"


def test_markdown_and_the_report_carry_the_breakdown(tmp_path: Path) -> None:
    md = sampling_markdown(sampling_analysis(records()))
    assert "### Votes: gsm8k-test / plan+verify+mixed7 (6 items with votes)" in md
    assert "2 items recorded no votes" in md
    assert "the vote missed a right sample in **2** and no sample was right in **2**" in md
    assert "| 7 | 2 | 1 | 50.0% |" in md
    assert sampling_markdown([]) == "No mode recorded its votes.\n"

    recs = [{**r, "latency_ms": {"total": 1000.0}} for r in records()]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    written = write_report([path], tmp_path / "out", recs)
    assert "## Votes of the sampling modes" in written["markdown"].read_text()
    summary = json.loads(written["json"].read_text())
    (sampling,) = summary["sampling"]
    assert sampling["missed"] == 2 and sampling["by_drawn"]["7"] == {"items": 2, "right": 1}
