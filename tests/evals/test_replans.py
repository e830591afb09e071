"""Replaying each replanning rule on its own from a run with every rule on
(`evals.replans`): paired per item, served as the orchestrator chooses between rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals import replans

pytestmark = [pytest.mark.unit]


def rnd(answer, verdict="unverified", confidence=0.5, agreeing=1, samples=1, reasons=(), ms=1e3):
    return {
        "replan_for": None,
        "answer": answer,
        "samples": samples,
        "agreeing": agreeing,
        "confidence": confidence,
        "verdict": verdict,
        "replan_reasons": list(reasons),
        "ms": ms,
    }


def record(item, gold, rounds, correct, error=None):
    r = {"id": item, "mode": "m", "dataset": "d", "gold": gold, "correct": correct, "error": error}
    if rounds is not None:
        r["replanning"] = rounds
    return r


RECORDS = [
    # no answer, then the right one: no_answer gains it for 2 s
    record("a", 4, [rnd(None, confidence=0.0, agreeing=0, reasons=["no_answer"]),
                    rnd("4", ms=2000.0)], True),
    # rejected and split, then an answer trusted more and right: both rules gain it, 4 s
    record("b", 6, [rnd("5", "rejected", 0.3, 2, 5, ["rejected", "low_agreement"]),
                    rnd("6", "unverified", 0.7, 3, 3, ms=4000.0)], True),
    # split, and the second round is trusted less: the first (right) is still served
    record("c", 7, [rnd("7", "unverified", 0.6, 2, 5, ["low_agreement"]),
                    rnd("8", "unverified", 0.4, 1, 3, ms=3000.0)], True),
    # one round, nothing to replan
    record("d", 1, None, True),
    # a right answer the verifier rejected, replaced by a verified wrong one: a loss
    record("f", 9, [rnd("9", "rejected", 0.45, reasons=["rejected"]),
                    rnd("10", "verified", 0.8, ms=1000.0)], False),
    # a failed request counts for nothing
    record("e", 1, None, False, error="504 deadline"),
]  # fmt: skip


def test_each_rule_is_replayed_alone_paired_per_item() -> None:
    got = replans.replay(RECORDS)
    assert (got["items"], got["failed"]) == (5, 1)
    # first rounds right: c, d, f
    assert got["without_replanning"] == {"right": 3, "accuracy": 0.6}
    assert got["served_with_every_rule"] == 4  # as recorded: a, b, c, d
    assert got["rules"]["no_answer"] == {
        "replanned": 1, "gained": 1, "lost": 0, "seconds": 2.0, "net": 1,
        "accuracy": 0.8, "right_per_100s": 50.0,
    }  # fmt: skip
    assert got["rules"]["rejected"] == {
        "replanned": 2, "gained": 1, "lost": 1, "seconds": 5.0, "net": 0,
        "accuracy": 0.6, "right_per_100s": 0.0,
    }  # fmt: skip
    assert got["rules"]["low_agreement"] == {
        "replanned": 2, "gained": 1, "lost": 0, "seconds": 7.0, "net": 1,
        "accuracy": 0.8, "right_per_100s": pytest.approx(14.286),
    }  # fmt: skip


def test_a_rule_that_never_fired_costs_nothing_and_reports_no_rate() -> None:
    got = replans.replay([record("d", 1, None, True)])
    assert got["rules"]["rejected"]["replanned"] == 0
    assert got["rules"]["rejected"]["right_per_100s"] is None


def test_the_command_reads_the_last_line_of_each_item(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run.jsonl"
    retried = record("a", 4, None, False, error="504 deadline")
    path.write_text("".join(json.dumps(r) + "\n" for r in [retried, *RECORDS[:1]]))
    assert replans.main([str(path)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["items"] == 1 and got["rules"]["no_answer"]["gained"] == 1


def test_a_run_with_more_than_one_replan_is_refused(tmp_path: Path, capsys) -> None:
    three = record("x", 1, [rnd("1", reasons=["rejected"]), rnd("2", reasons=["rejected"]),
                            rnd("3")], True)  # fmt: skip
    with pytest.raises(ValueError, match="ORCH_MAX_REPLANS=1"):
        replans.replay([three])
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(three) + "\n")
    assert replans.main([str(path)]) == 2
    assert "ORCH_MAX_REPLANS=1" in capsys.readouterr().err


def test_a_failed_second_round_costs_its_time_and_changes_no_answer() -> None:
    failed = {**rnd(None, confidence=0.0, agreeing=0, samples=0, ms=5000.0), "error": "x"}
    got = replans.replay([record("f", 9, [rnd("9", "rejected", 0.4, reasons=["rejected"]),
                                          failed], True)])  # fmt: skip
    assert got["rules"]["rejected"]["replanned"] == 1
    assert (got["rules"]["rejected"]["net"], got["rules"]["rejected"]["seconds"]) == (0, 5.0)
