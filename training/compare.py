"""Paired comparison of two verifiers scored on the same claims.

Reads the per-claim logit files that `training.evaluate --scores-out` writes and, per
split, compares model B against model A claim by claim: accuracy of each, the difference
with a paired bootstrap 95% interval, the discordant counts (claims only A gets right,
only B gets right) with McNemar's exact two-sided p-value, and the AUROC difference with
its paired bootstrap interval. A paired test on the same claims separates two models far
better than the two independent ±intervals of their accuracies suggest.

    python -m training.compare var/scores-committed.json:lora var/scores-v3.json:lora
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any

from training.metrics import auroc

CALIBRATION_KEYS = ("temperature", "bias")


def _load(spec: str) -> dict[str, Any]:
    """`FILE:MODEL` (MODEL is a key of the file, e.g. `untrained` or `lora`)."""
    path, _, model = spec.rpartition(":")
    if not path:
        raise ValueError(f"{spec!r}: write FILE:MODEL, e.g. var/scores.json:lora")
    scores = json.loads(Path(path).read_text())
    if model not in scores:
        raise ValueError(f"{path} has no model {model!r} (it has {sorted(scores)})")
    return dict(scores[model])


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p-value: binomial(only_a + only_b, 1/2) tail, doubled."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _interval(values: list[float]) -> list[float]:
    values = sorted(values)
    return [round(values[int(0.025 * len(values))], 4), round(values[int(0.975 * len(values))], 4)]


def compare_split(
    a: list[dict[str, Any]],
    b: list[dict[str, Any]],
    resamples: int,
    seed: int,
    calibration_a: tuple[float, float] = (1.0, 0.0),
    calibration_b: tuple[float, float] = (1.0, 0.0),
) -> dict[str, Any]:
    """B against A on one split; a verdict is TRUE when z / T + b >= 0 for the model's (T, b)."""
    if [r["id"] for r in a] != [r["id"] for r in b]:
        raise ValueError("the two files scored different claims; score the same split and limit")
    labels = [bool(r["label"]) for r in a]
    za, zb = [float(r["z"]) for r in a], [float(r["z"]) for r in b]
    (ta, ba), (tb, bb) = calibration_a, calibration_b
    right_a = [(z / ta + ba >= 0) == y for z, y in zip(za, labels, strict=True)]
    right_b = [(z / tb + bb >= 0) == y for z, y in zip(zb, labels, strict=True)]
    n = len(labels)
    only_a = sum(x and not y for x, y in zip(right_a, right_b, strict=True))
    only_b = sum(y and not x for x, y in zip(right_a, right_b, strict=True))
    rng = random.Random(seed)
    acc_diffs, auc_diffs = [], []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        acc_diffs.append(sum(right_b[i] - right_a[i] for i in idx) / n)
        ys = [labels[i] for i in idx]
        if any(ys) and not all(ys):
            auc_diffs.append(auroc([zb[i] for i in idx], ys) - auroc([za[i] for i in idx], ys))
    return {
        "n": n,
        "accuracy_a": round(sum(right_a) / n, 4),
        "accuracy_b": round(sum(right_b) / n, 4),
        "accuracy_diff": round((sum(right_b) - sum(right_a)) / n, 4),
        "accuracy_diff_95": _interval(acc_diffs),
        "only_a_right": only_a,
        "only_b_right": only_b,
        "mcnemar_p": round(mcnemar_p(only_a, only_b), 6),
        "auroc_a": round(auroc(za, labels), 4),
        "auroc_b": round(auroc(zb, labels), 4),
        "auroc_diff_95": _interval(auc_diffs),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("a", help="FILE:MODEL of the reference (e.g. the committed adapter)")
    parser.add_argument("b", help="FILE:MODEL of the candidate")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=7, help="seeds the bootstrap")
    args = parser.parse_args(argv)
    a, b = _load(args.a), _load(args.b)
    splits = [s for s in a if s not in CALIBRATION_KEYS and s in b]
    cal_a = (float(a.get("temperature", 1.0)), float(a.get("bias", 0.0)))
    cal_b = (float(b.get("temperature", 1.0)), float(b.get("bias", 0.0)))
    result = {
        "a": args.a,
        "b": args.b,
        **{s: compare_split(a[s], b[s], args.resamples, args.seed, cal_a, cal_b) for s in splits},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
