"""Report and routing figures on synthetic results whose answers are known by construction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals.report import summarize, write_report
from evals.routing import routing_analysis, routing_markdown
from evals.stats import wilson_interval

pytestmark = pytest.mark.unit


def rec(
    item: str,
    mode: str,
    correct: bool,
    *,
    dataset: str = "gsm8k-test",
    total: float = 100.0,
    verdict: str | None = None,
    confidence: float | None = None,
    schema_valid: bool | None = True,
    cached: bool = False,
    error: str | None = None,
) -> dict[str, Any]:
    pipeline = mode != "direct"
    return {
        "id": item,
        "dataset": dataset,
        "mode": mode,
        "model": "llamacpp:toy",
        "correct": correct,
        "verdict": verdict if pipeline else None,
        "confidence": confidence,
        "schema_valid": schema_valid if pipeline else None,
        "cached": cached,
        "error": error,
        "latency_ms": {
            "plan": total * 0.6 if pipeline else None,
            "execute": total * 0.1 if pipeline else None,
            "verify": total * 0.3 if verify_mode(mode) else None,
            "total": total,
        },
    }


def verify_mode(mode: str) -> bool:
    return "verify" in mode


def synthetic() -> list[dict[str, Any]]:
    records = []
    # direct: 2/10 right; latencies 1..10 s
    for i in range(10):
        records.append(rec(f"q{i}", "direct", i in (0, 1), total=1000.0 * (i + 1)))
    # plan: 5/10 right; one item errored (wrong, excluded from latency), one plan missing
    for i in range(10):
        records.append(
            rec(
                f"q{i}",
                "plan",
                i in (1, 2, 3, 4, 5),
                total=500.0,
                verdict="unverified",
                confidence=0.5,
                schema_valid=i != 9,
                error="503 dependency_unavailable: planner down" if i == 9 else None,
                cached=i == 8,
            )
        )
    # plan+verify: 6/10 right; confident on right answers, hesitant on wrong ones
    for i in range(10):
        right = i in (0, 2, 3, 4, 5, 6)
        records.append(
            rec(
                f"q{i}",
                "plan+verify",
                right,
                total=800.0,
                verdict="verified" if right else "rejected",
                confidence=0.9 if right else 0.1,
            )
        )
    return records


def by_mode(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {s.mode: s for s in summarize(records)}


def test_accuracy_interval_errors_and_schema_validity() -> None:
    s = by_mode(synthetic())
    assert [x.mode for x in summarize(synthetic())] == ["direct", "plan", "plan+verify"]
    assert s["direct"].n == 10 and s["direct"].accuracy == 0.2
    assert s["direct"].ci95 == wilson_interval(2, 10)
    assert s["direct"].schema_valid is None and s["direct"].cache_hit_rate is None
    assert s["plan"].accuracy == 0.5 and s["plan"].errors == 1
    # the errored item timed out: it says nothing about plan validity and is left out
    assert s["plan"].schema_valid == pytest.approx(1.0)
    assert s["plan"].cache_hit_rate == pytest.approx(0.1)


def test_planning_failures_count_against_schema_validity() -> None:
    records = [
        rec("a", "plan", True, verdict="unverified"),
        rec("b", "plan", False, schema_valid=False, error="502 planning_failed: no valid plan"),
        rec("c", "plan", False, schema_valid=False, error="503 dependency_unavailable: slow"),
        rec("d", "plan", False, schema_valid=None, error="client timeout after 150 s"),
    ]
    [s] = summarize(records)
    assert s.schema_valid == pytest.approx(0.5) and s.errors == 3 and s.accuracy == 0.25


def test_answers_served_from_prose_say_nothing_about_plan_validity() -> None:
    """A mixed mode's answer from the model's worked solution carries no plan: it is left
    out of the schema-valid share, whether the line says so (`None`) or was written
    before it did (`False` with no steps); a returned plan that fails the check counts."""
    records = [
        rec("a", "plan+verify+mixed7", True),
        rec("b", "plan+verify+mixed7", True, schema_valid=None),
        {**rec("c", "plan+verify+mixed7", False, schema_valid=False), "n_steps": 0},
        {**rec("d", "plan+verify+mixed7", False, schema_valid=False), "n_steps": 2},
    ]
    [s] = summarize(records)
    assert s.schema_valid == pytest.approx(0.5) and s.accuracy == 0.5


def test_latency_percentiles_per_stage() -> None:
    s = by_mode(synthetic())
    total = s["direct"].latency_ms["total"]
    assert total["p50"] == pytest.approx(5500.0)  # median of 1000..10000
    assert total["p95"] == pytest.approx(9550.0)
    assert "plan" not in s["direct"].latency_ms
    plan = s["plan"].latency_ms
    assert plan["total"]["n"] == 9  # the errored item is left out
    assert plan["plan"]["p50"] == pytest.approx(300.0)
    assert "verify" not in plan
    assert s["plan+verify"].latency_ms["verify"]["p95"] == pytest.approx(240.0)


def test_calibration_of_the_served_confidence_and_verified_precision() -> None:
    s = by_mode(synthetic())
    assert s["direct"].scored == 0 and s["direct"].ece is None  # no served confidence
    # plan: every answered item counts (the errored one has no response): 5 of 9 right
    # at 0.5 in one bin
    assert s["plan"].scored == 9
    assert s["plan"].ece == pytest.approx(abs(0.5 - 5 / 9))
    assert s["plan"].verified == 0 and s["plan"].verified_precision is None
    pv = s["plan+verify"]
    assert pv.scored == 10
    # right answers at 0.9 (6 items, all right) and wrong at 0.1 (4 items, none right)
    assert pv.ece == pytest.approx(0.6 * 0.1 + 0.4 * 0.1)
    used = [b for b in pv.calibration if b.count]
    assert [(b.count, b.accuracy) for b in used] == [(4, 0.0), (6, 1.0)]
    assert (pv.verified, pv.verified_right) == (6, 6)
    assert pv.verified_precision == 1.0 and pv.verified_coverage == pytest.approx(0.6)


def test_a_verified_wrong_answer_lowers_precision_not_coverage() -> None:
    records = [
        rec("a", "plan+verify", True, verdict="verified", confidence=0.9),
        rec("b", "plan+verify", False, verdict="verified", confidence=0.9),
        rec("c", "plan+verify", False, verdict="unverified", confidence=0.0),
        rec("d", "plan+verify", False, verdict=None, error="503 dependency_unavailable: x"),
    ]
    [s] = summarize(records)
    assert s.verified_precision == 0.5 and s.verified_coverage == 0.5
    assert s.scored == 3  # the failed request has no confidence


def test_routing_oracle_headroom_and_pairs() -> None:
    [rep] = routing_analysis(synthetic())
    assert rep.dataset == "gsm8k-test" and rep.n_items == 10
    assert rep.accuracy == {"direct": 0.2, "plan": 0.5, "plan+verify": 0.6}
    # right sets: direct {0,1}; plan {1..5}; plan+verify {0,2,3,4,5,6}; union {0..6}
    assert rep.oracle_accuracy == pytest.approx(0.7)
    assert rep.best_mode == "plan+verify"
    assert rep.headroom == pytest.approx(0.1)
    assert rep.rescues["plan+verify"]["direct"] == 5  # {2,3,4,5,6}
    assert rep.rescues["direct"]["plan+verify"] == 1  # {1}
    assert rep.loses("plan+verify", "direct") == 1
    assert rep.rescues["plan"]["plan+verify"] == 1  # {1}
    assert rep.rescues["plan+verify"]["plan"] == 2  # {0, 6}
    assert rep.only_correct == {"direct": 0, "plan": 0, "plan+verify": 1}
    assert rep.none_correct == 3
    md = routing_markdown([rep])
    assert "70.0%" in md and "headroom 10.0 points" in md


def test_routing_uses_only_items_every_mode_has() -> None:
    records = [
        rec("a", "direct", True),
        rec("b", "direct", False),
        rec("a", "plan", False),
        rec("c", "plan", True),
        rec("x", "direct", True, dataset="svamp"),  # one mode only: no routing for svamp
    ]
    reports = routing_analysis(records)
    assert [r.dataset for r in reports] == ["gsm8k-test"]
    rep = reports[0]
    assert rep.n_items == 1 and rep.dropped_items == 2
    assert rep.oracle_accuracy == 1.0 and rep.rescues["direct"]["plan"] == 1
    assert routing_analysis(records, modes=["direct"]) == []


def test_write_report_makes_markdown_json_and_pngs(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in synthetic()))
    written = write_report([results], tmp_path / "out", synthetic())
    for key in ("accuracy_latency", "reliability", "markdown", "json"):
        assert written[key].exists() and written[key].stat().st_size > 0
    for key in ("accuracy_latency", "reliability"):
        assert written[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = written["markdown"].read_text()
    assert "| gsm8k-test | direct | 10 | 20.0% [" in md
    assert "![reliability diagram](reliability.png)" in md
    # the ECE a perfectly calibrated confidence would measure on these items, beside it
    assert "(ECE 0.100; perfectly calibrated, the same confidences would measure" in md
    assert "Oracle accuracy" in md
    # the served confidence's ECE with its item count, and verified precision and coverage
    assert md.count("| 0.100 (n=10) | 6 / 6 (100.0%, 60.0%) |") == 1
    summary = json.loads(written["json"].read_text())
    assert {g["mode"] for g in summary["groups"]} == {"direct", "plan", "plan+verify"}
    assert summary["routing"][0]["oracle_accuracy"] == pytest.approx(0.7)


@pytest.mark.unit
def test_log_latency_axis_labels_only_the_twos_and_fives() -> None:
    from evals.plots import minor_log_label

    assert [minor_log_label(v) for v in (2.0, 3.0, 5.0, 20.0, 40.0, 50.0, 0.2)] == [
        "2",
        "",
        "5",
        "20",
        "",
        "50",
        "0.2",
    ]
