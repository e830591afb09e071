"""Calibration and ranking metrics for binary verdicts, and temperature fitting.

Probabilities are P(claim is TRUE); labels are booleans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

ECE_BINS = 15


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def accuracy(probs: Sequence[float], labels: Sequence[bool], threshold: float = 0.5) -> float:
    return sum((p >= threshold) == y for p, y in zip(probs, labels, strict=True)) / len(labels)


def ece(probs: Sequence[float], labels: Sequence[bool], bins: int = ECE_BINS) -> float:
    """Expected calibration error with `bins` equal-width bins over P(TRUE) in [0, 1].

    The gap in each bin is |mean predicted P(TRUE) - share of TRUE claims|, weighted by
    the bin's share of claims.
    """
    totals = [0] * bins
    conf = [0.0] * bins
    hits = [0.0] * bins
    for p, y in zip(probs, labels, strict=True):
        b = min(int(p * bins), bins - 1)
        totals[b] += 1
        conf[b] += p
        hits[b] += float(y)
    n = len(labels)
    return sum(abs(conf[b] - hits[b]) / n for b in range(bins) if totals[b])


def brier(probs: Sequence[float], labels: Sequence[bool]) -> float:
    return sum((p - float(y)) ** 2 for p, y in zip(probs, labels, strict=True)) / len(labels)


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve (probability a TRUE claim outscores a FALSE one; ties 1/2)."""
    pos = sum(labels)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def nll(logits: Sequence[float], labels: Sequence[bool], temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of the labels under sigmoid(z / T)."""
    total = 0.0
    for z, y in zip(logits, labels, strict=True):
        s = z / temperature if y else -z / temperature
        # -log(sigmoid(s)) computed stably
        total += math.log1p(math.exp(-s)) if s > 0 else -s + math.log1p(math.exp(s))
    return total / len(labels)


def fit_temperature(logits: Sequence[float], labels: Sequence[bool]) -> float:
    """The temperature T > 0 minimising the NLL of sigmoid(z / T) (golden-section on log T)."""
    if not logits:
        raise ValueError("need at least one claim to fit a temperature")
    lo, hi = math.log(0.01), math.log(100.0)
    golden = (math.sqrt(5) - 1) / 2
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = nll(logits, labels, math.exp(a)), nll(logits, labels, math.exp(b))
    for _ in range(80):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = nll(logits, labels, math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = nll(logits, labels, math.exp(b))
    return math.exp((lo + hi) / 2)


def report(
    logits: Sequence[float], labels: Sequence[bool], temperature: float = 1.0
) -> dict[str, float]:
    probs = [sigmoid(z / temperature) for z in logits]
    return {
        "n": len(labels),
        "accuracy": round(accuracy(probs, labels), 4),
        "ece": round(ece(probs, labels), 4),
        "brier": round(brier(probs, labels), 4),
        "auroc": round(auroc(logits, labels), 4),
        "nll": round(nll(logits, labels, temperature), 4),
    }
