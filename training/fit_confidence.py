"""Fit the orchestrator's answer-confidence calibrator on pipeline runs over the dev split.

Input: result lines of `reason eval run` over the GSM8K train dev split
(`scripts/eval_dev.sh`; never GSM8K test or SVAMP). Each line gives the request's signals
(agreement among the served round's plans, plans drawn, whether the served plan ran
to the end, the verifier's score) and whether the answer was right. Two logistic models
are fitted on the same lines, one with the verifier's score and one without it. With
`--folds` (default 10) each dev answer is also scored by the calibrator fitted on the
other folds, the estimate to expect on unseen answers; the `verified` threshold is the
lowest of those confidences at which the dev answers at or above it are right at least
`--precision` of the time, counted by the one-sided Wilson lower bound at `--bound`
(default 0.9) rather than the observed share. Output: the versioned artifact the
orchestrator loads (orchestrator/calibration/answer-confidence.json), with in-sample and
cross-validated `dev_metrics` and the threshold's dev precision and coverage.

    python -m training.fit_confidence docs/eval/dev/*.jsonl --plan-format json \
        --out orchestrator/calibration/answer-confidence.json

The fit is a few-weight L2-regularised logistic regression by Newton's method in numpy:
scikit-learn would do the same, but it would be a dependency of the training extra for
five weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from evals.data import iter_results
from evals.stats import wilson_interval
from orchestrator.confidence import ARTIFACT_FORMAT, FEATURES, Calibrator, features
from services.schemas import Signals
from training.metrics import auroc, brier, ece

OK_STATUSES = {"ok", "fallback"}
WITHOUT_VERIFIER = tuple(f for f in FEATURES if f != "verifier_logit")


def signals_of(record: dict[str, Any]) -> Signals | None:
    """The signals of one result line: the response's own (`signals`), or, for lines
    written before responses carried them, read from its agreement, verdict and steps.
    None for a line without an answer (its confidence is 0 by rule) or a failed request."""
    if record.get("error") or record.get("answer_text") is None:
        return None
    if isinstance(record.get("signals"), dict):
        return Signals.model_validate(record["signals"])
    agreement = record.get("agreement") or {}
    plans = int(agreement.get("plans") or 1)
    agreeing = int(agreement.get("agreeing") or 1)
    verdict = record.get("verdict")
    verifier = record.get("confidence") if verdict in ("verified", "rejected") else None
    return Signals(
        agreement=agreeing / plans if plans else 0.0,
        plans=plans,
        complete=all(s in OK_STATUSES for s in record.get("step_statuses") or []),
        verifier=verifier,
        rounds=int(agreement.get("rounds") or 1),
    )


def fit_logistic(
    x: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 50
) -> tuple[np.ndarray, float]:
    """Weights and bias minimising the log loss plus l2/2 * |w|^2 (the bias is not
    penalised), by Newton's method."""
    n, d = x.shape
    a = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    penalty = np.full(d + 1, l2)
    penalty[-1] = 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(a @ w)))
        grad = a.T @ (p - y) + penalty * w
        hess = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return w[:-1], float(w[-1])


L2_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def choose_l2(x: np.ndarray, y: np.ndarray, grid: tuple[float, ...] = L2_GRID) -> float:
    """The penalty with the lowest leave-one-out log loss (dev splits are small)."""

    def loo(l2: float) -> float:
        total = 0.0
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            w, b = fit_logistic(x[keep], y[keep], l2=l2)
            p = 1 / (1 + np.exp(-(x[i] @ w + b)))
            p = min(max(p, 1e-6), 1 - 1e-6)
            total -= y[i] * np.log(p) + (1 - y[i]) * np.log(1 - p)
        return total / len(y)

    return min(grid, key=loo)


def choose_threshold(
    probs: list[float],
    labels: list[bool],
    precision: float,
    min_covered: int = 1,
    z: float = 0.0,
) -> float:
    """The lowest confidence at which the answers at or above it (at least `min_covered`
    of them) are right at least `precision` of the time; 1.0 (nothing verified) when no
    such point exists. With `z` > 0 the precision counted is the lower end of its
    one-sided Wilson interval, `z` standard errors below the observed share: the lowest
    point that only just reaches the target on a few hundred dev answers sits where the
    answers below it are mostly wrong, and falls short of it on answers not yet seen."""
    pairs = sorted(zip(probs, labels, strict=True), reverse=True)
    best = 1.0
    right = 0
    for k, (p, y) in enumerate(pairs, 1):
        right += y
        if k < min_covered or (k < len(pairs) and pairs[k][0] == p):
            continue  # a threshold takes every answer of its confidence, or none
        if wilson_interval(right, k, z)[0] >= precision:
            best = p
    return float(best)


def _bound(text: str) -> float:
    """--bound: a one-sided confidence level in [0.5, 1) (0.5: the observed share)."""
    value = float(text)
    if not 0.5 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not in [0.5, 1)")
    return value


Rows = list[tuple[Signals, bool]]
MODELS = (
    ("with_verifier", FEATURES, lambda s: s.verifier is not None),
    ("without_verifier", WITHOUT_VERIFIER, lambda s: True),
)


def fit_models(
    rows: Rows, l2s: dict[str, float] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The artifact's two logistic models (one with the verifier's score, fitted on the
    rows that have one; one without it, on every row), each with its penalty in `l2s`,
    else one chosen by leave-one-out; and, per model, its rows and penalty."""
    models: dict[str, Any] = {}
    report: dict[str, Any] = {}
    for name, names, keep in MODELS:
        subset = [(s, y) for s, y in rows if keep(s)]
        if len(subset) < 10:
            raise SystemExit(f"{name}: {len(subset)} lines, too few to fit")
        x = np.array([[features(s)[f] for f in names] for s, _ in subset])
        y = np.array([y for _, y in subset], dtype=float)
        penalty = (l2s or {}).get(name)
        if penalty is None:
            penalty = choose_l2(x, y)
        w, b = fit_logistic(x, y, l2=penalty)
        models[name] = {"weights": dict(zip(names, map(float, w), strict=True)), "bias": b}
        report[name] = {"n": len(subset), "l2": penalty}
    return models, report


def cross_validated(
    rows: Rows, l2s: dict[str, float], folds: int = 10, seed: int = 0
) -> list[float]:
    """Each row's confidence from the calibrator fitted on the other folds (the same
    penalties; seeded folds): what the fit promises on answers it has not seen. The
    in-sample figures of a few hundred dev answers flatter a steep fit."""
    order = np.random.default_rng(seed).permutation(len(rows))
    probs = [0.0] * len(rows)
    for held in np.array_split(order, folds):
        out = set(held.tolist())
        models, _ = fit_models([r for k, r in enumerate(rows) if k not in out], l2s=l2s)
        calibrator = Calibrator.from_dict(
            {"format": ARTIFACT_FORMAT, "version": "cv", "threshold": 1.0, **models}
        )
        for k in out:
            probs[k] = calibrator.confidence(rows[k][0], answered=True)
    return probs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--plan-format", required=True, help="the planner's PLANNER_PLAN_FORMAT")
    parser.add_argument(
        "--verifier",
        help="the verifier whose scores the runs hold, recorded in fitted_for "
        "(e.g. qwen2.5-coder-0.5b-instruct/llamacpp: VERIFIER_BASE_MODEL/VERIFIER_RUNTIME)",
    )
    parser.add_argument("--precision", type=float, default=0.9)
    parser.add_argument(
        "--bound",
        type=_bound,
        default=0.9,
        help="one-sided confidence that the threshold's precision is at least --precision "
        "(its Wilson lower bound; 0.5: the observed share)",
    )
    parser.add_argument(
        "--l2", type=float, default=None, help="L2 penalty (default: by leave-one-out)"
    )
    parser.add_argument(
        "--min-verified", type=int, default=5, help="dev answers the threshold must cover"
    )
    parser.add_argument(
        "--folds",
        type=int,
        default=10,
        help="cross-validation folds for dev_metrics and the threshold (0: none, and the "
        "threshold chosen on the in-sample confidences)",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the cross-validation folds")
    parser.add_argument("--version", default=datetime.now(UTC).strftime("%Y-%m-%d"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    rows: list[tuple[Signals, bool]] = []
    planner_models: set[str] = set()
    modes: set[str] = set()
    unanswered = 0
    for path in args.results:
        last: dict[tuple[str, str], dict[str, Any]] = {}
        for record in iter_results(path):
            last[(record["mode"], record["id"])] = record  # an item's last line counts
        for record in last.values():
            if not str(record.get("dataset", "")).startswith("gsm8k-train"):
                raise SystemExit(f"{path}: {record.get('dataset')} is not the train dev split")
            if record["mode"] == "direct":
                raise SystemExit(f"{path}: `direct` lines have no pipeline signals")
            # the evaluation names the model backend:model; the artifact, the model
            model = str(record.get("model"))
            planner_models.add(model.partition(":")[2] or model)
            modes.add(str(record["mode"]))
            signals = signals_of(record)
            if signals is None:
                unanswered += 1
                continue
            rows.append((signals, bool(record["correct"])))
    if len(rows) < 10 or len({y for _, y in rows}) < 2:
        raise SystemExit(f"{len(rows)} answered lines: too few, or all right or all wrong")
    labels = np.array([y for _, y in rows], dtype=float)
    artifact: dict[str, Any] = {
        "format": ARTIFACT_FORMAT,
        "version": args.version,
        "features": list(FEATURES),
    }
    models, report = fit_models(
        rows, None if args.l2 is None else {name: args.l2 for name, _, _ in MODELS}
    )
    artifact.update(models)
    artifact["threshold"] = 1.0
    calibrator = Calibrator.from_dict(artifact)
    probs = [calibrator.confidence(s, answered=True) for s, _ in rows]
    ys = [bool(v) for v in labels]
    l2s = {name: r["l2"] for name, r in report.items()}
    # the threshold is chosen on what the fit promises for answers it has not seen:
    # each dev answer's confidence from the calibrator fitted on the other folds
    held = cross_validated(rows, l2s, args.folds, args.seed) if args.folds > 1 else None
    chosen_on = held if held is not None else probs
    # only an answer the verifier scored can be served `verified` (served_verdict)
    scored = [
        (p, y) for (s, _), p, y in zip(rows, chosen_on, ys, strict=True) if s.verifier is not None
    ]
    z = NormalDist().inv_cdf(args.bound)
    threshold = choose_threshold(
        [p for p, _ in scored], [y for _, y in scored], args.precision, args.min_verified, z
    )
    covered = [y for p, y in scored if threshold < 1.0 and p >= threshold]
    # what the shipped calibrator itself verifies of the same dev answers
    served = [
        y
        for (s, _), p, y in zip(rows, probs, ys, strict=True)
        if s.verifier is not None and threshold < 1.0 and p >= threshold
    ]
    artifact["threshold"] = threshold
    artifact["fitted_for"] = {
        "planner_models": sorted(planner_models),
        "plan_format": args.plan_format,
        "modes": sorted(modes),
        **({"verifier": args.verifier} if args.verifier else {}),
    }
    artifact["fitted_on"] = {
        "results": [str(p) for p in args.results],
        "answered": len(rows),
        "unanswered": unanswered,
        "right": int(labels.sum()),
    }
    artifact["dev_metrics"] = {
        "ece": round(ece(probs, ys), 4),
        "brier": round(brier(probs, ys), 4),
        "auroc": round(auroc(probs, ys), 4) if 0 < sum(ys) < len(ys) else None,
        "note": "ece, brier, auroc: in-sample, on the dev split the calibrator was fitted on",
        **report,
    }
    if held is not None:
        artifact["dev_metrics"]["cross_validated"] = {
            "folds": args.folds,
            "seed": args.seed,
            "ece": round(ece(held, ys), 4),
            "brier": round(brier(held, ys), 4),
            "auroc": round(auroc(held, ys), 4) if 0 < sum(ys) < len(ys) else None,
            "note": "each answer scored by the calibrator fitted on the other folds",
        }
    artifact["dev_metrics"]["threshold"] = {
        "precision_target": args.precision,
        "bound": args.bound,
        "chosen_on": "cross_validated" if held is not None else "in-sample",
        "verified_precision": round(sum(covered) / len(covered), 4) if covered else None,
        "verified_coverage": round(len(covered) / len(ys), 4),  # of all answered lines
        "in_sample_precision": round(sum(served) / len(served), 4) if served else None,
        "in_sample_coverage": round(len(served) / len(ys), 4),
        "note": "the lowest confidence (of `chosen_on`) whose dev answers at or above it are "
        "right at least precision_target of the time, by the one-sided Wilson lower bound "
        "at `bound`; verified_*: on those confidences, in_sample_*: the shipped "
        "calibrator's on the same answers",
    }
    artifact["command"] = "python -m training.fit_confidence " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(artifact, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(artifact["dev_metrics"]))
    return artifact


if __name__ == "__main__":
    main()
