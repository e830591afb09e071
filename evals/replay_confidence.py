"""Replay a calibrator over recorded result lines: what a refitted calibrator would have
served on runs made before it.

The served confidence is a function of the request's recorded signals alone
(`orchestrator.confidence`), so a refit can be measured on the reporting runs without
running them again: each line's confidence is recomputed from its `signals` with the
given artifact, and `verified` is recomputed from its threshold. Reporting only: the
artifact must have been fitted on other data (the dev split), never on these lines.

    python -m evals.replay_confidence orchestrator/calibration/answer-confidence.json \
        docs/eval/1.5b-draft-2/results/gsm8k-plan+verify+mixed7.jsonl

The population is the report's (`evals.report`): pipeline lines without a request error;
a line with no answer scores 0. The last line of an item id counts (a resumed run may
repeat one).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evals.stats import ECE_BINS, ece_of_calibrated, expected_calibration_error
from orchestrator.confidence import Calibrator
from training.fit_confidence import signals_of
from training.metrics import auroc, brier


@dataclass(frozen=True)
class Replay:
    source: str
    calibrator: str
    scored: int
    right: int
    ece: float
    ece_floor_mean: float
    ece_floor_p95: float
    brier: float
    auroc: float | None
    threshold: float
    verified: int
    verified_right: int


def replay(
    calibrator: Calibrator, records: list[dict[str, Any]]
) -> tuple[list[float], list[bool], list[bool]]:
    """Each scored line's confidence under `calibrator`, whether it is right, and whether
    it would be served `verified` (an answer the verifier scored, at or above the
    threshold, as `orchestrator.service` decides)."""
    confidences: list[float] = []
    right: list[bool] = []
    verified: list[bool] = []
    for record in records:
        if record.get("mode") == "direct" or record.get("error"):
            continue
        signals = signals_of(record)
        confidence = 0.0 if signals is None else calibrator.confidence(signals, answered=True)
        confidences.append(confidence)
        right.append(bool(record.get("correct")))
        verified.append(
            signals is not None
            and signals.verifier is not None
            and calibrator.threshold < 1.0
            and confidence >= calibrator.threshold
        )
    return confidences, right, verified


def last_per_id(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return list({r["id"]: r for r in map(json.loads, filter(str.strip, fh))}.values())


def measure(calibrator: Calibrator, path: Path, name: str) -> Replay:
    confidences, right, verified = replay(calibrator, last_per_id(path))
    if not confidences:
        raise SystemExit(f"{path}: no scored pipeline lines")
    floor_mean, floor_p95 = ece_of_calibrated(confidences, ECE_BINS)
    both = len(set(right)) == 2
    return Replay(
        source=str(path),
        calibrator=name,
        scored=len(confidences),
        right=sum(right),
        ece=round(expected_calibration_error(confidences, right, ECE_BINS), 4),
        ece_floor_mean=round(floor_mean, 4),
        ece_floor_p95=round(floor_p95, 4),
        brier=round(brier(confidences, right), 4),
        auroc=round(auroc(confidences, right), 4) if both else None,
        threshold=calibrator.threshold,
        verified=sum(verified),
        verified_right=sum(v and r for v, r in zip(verified, right, strict=True)),
    )


def main(argv: list[str] | None = None) -> list[Replay]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calibrator", type=Path, help="an answer-confidence/1 artifact")
    parser.add_argument("results", type=Path, nargs="+", help="result lines (JSONL)")
    parser.add_argument("--json", action="store_true", help="one JSON object a file")
    args = parser.parse_args(argv)
    calibrator = Calibrator.load(args.calibrator)
    name = f"{args.calibrator} ({calibrator.version})"
    out = [measure(calibrator, path, name) for path in args.results]
    for r in out:
        if args.json:
            print(json.dumps(asdict(r)))
            continue
        share = f"{r.verified_right / r.verified:.1%}" if r.verified else "n/a"
        print(
            f"{r.source}: {r.scored} scored, {r.right} right; ECE {r.ece:.3f} "
            f"(calibrated floor {r.ece_floor_mean:.3f}, P95 {r.ece_floor_p95:.3f}); "
            f"Brier {r.brier:.3f}; AUROC {r.auroc}; verified at {r.threshold:.3f}: "
            f"{r.verified_right}/{r.verified} right ({share}), "
            f"coverage {r.verified / r.scored:.1%}"
        )
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
