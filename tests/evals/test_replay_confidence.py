"""Replaying a calibrator over recorded result lines."""

from __future__ import annotations

import json
import math

import pytest

from evals.replay_confidence import main, replay
from orchestrator.confidence import Calibrator

pytestmark = pytest.mark.unit

ARTIFACT = {
    "format": "answer-confidence/1",
    "version": "test.1",
    "with_verifier": {"weights": {"agreement": 4.0, "verifier_logit": 1.0}, "bias": -2.0},
    "without_verifier": {"weights": {"agreement": 4.0}, "bias": -2.5},
    "threshold": 0.8,
}


def record(
    id_: str, correct: bool, agreement: float | None, verifier: float | None = None, **kw
) -> dict:
    signals = (
        None
        if agreement is None
        else {
            "agreement": agreement,
            "plans": 2,
            "complete": True,
            "verifier": verifier,
            "rounds": 1,
        }
    )
    return {
        "id": id_,
        "mode": "plan+verify+mixed7",
        "correct": correct,
        "answer_text": None if agreement is None else "72",
        "signals": signals,
        "error": None,
        **kw,
    }


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_confidence_comes_from_the_recorded_signals_and_verified_needs_the_verifier() -> None:
    calibrator = Calibrator.from_dict(ARTIFACT)
    records = [
        record("a", True, 1.0, verifier=0.5),  # 4 - 2 = 2: sigmoid 0.88, verified
        record("b", True, 1.0),  # no verifier: 4 - 2.5, sigmoid 0.82, not verified
        record("c", False, 0.5, verifier=0.5),  # 2 - 2 = 0: 0.5
        record("d", False, None),  # no answer: 0
        record("e", False, 1.0, verifier=0.5, error="timeout"),  # a failed request: not scored
        {**record("f", True, 1.0, verifier=0.5), "mode": "direct"},  # not the pipeline
    ]
    confidences, right, verified = replay(calibrator, records)
    assert confidences == pytest.approx([sigmoid(2.0), sigmoid(1.5), 0.5, 0.0])
    assert right == [True, True, False, False]
    assert verified == [True, False, False, False]


def test_the_cli_counts_the_last_line_of_an_item_and_reports_verified_precision(
    tmp_path, capsys
) -> None:
    artifact = tmp_path / "cal.json"
    artifact.write_text(json.dumps(ARTIFACT))
    results = tmp_path / "r.jsonl"
    lines = [
        record("a", False, 0.5, verifier=0.5),  # replaced by the resumed run's line
        record("b", False, 1.0, verifier=0.5),
        record("a", True, 1.0, verifier=0.5),
    ]
    results.write_text("".join(json.dumps(r) + "\n" for r in lines))
    (out,) = main([str(artifact), str(results)])
    assert (out.scored, out.right, out.verified, out.verified_right) == (2, 1, 2, 1)
    assert out.calibrator.endswith("(test.1)")
    assert "1/2 right (50.0%)" in capsys.readouterr().out
