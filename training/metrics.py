"""Calibration and ranking metrics for binary verdicts, and temperature fitting.

Probabilities are P(claim is TRUE); labels are booleans. A raw score is the logit
difference z = logit(TRUE) - logit(FALSE); calibrated, it reads sigmoid(z / T + b): the
temperature T rescales confidence, the bias b moves the point where the verdict flips
(b = 0 is plain temperature scaling).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

ECE_BINS = 15
BIAS_LIMIT = 20.0  # bounds the bias search; a fit that reaches it is degenerate


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


def calibrated(z: float, temperature: float = 1.0, bias: float = 0.0) -> float:
    """P(TRUE) of a raw logit difference after calibration."""
    return sigmoid(z / temperature + bias)


def nll(
    logits: Sequence[float], labels: Sequence[bool], temperature: float = 1.0, bias: float = 0.0
) -> float:
    """Mean negative log-likelihood of the labels under sigmoid(z / T + b)."""
    total = 0.0
    for z, y in zip(logits, labels, strict=True):
        s = z / temperature + bias
        s = s if y else -s
        # -log(sigmoid(s)) computed stably
        total += math.log1p(math.exp(-s)) if s > 0 else -s + math.log1p(math.exp(s))
    return total / len(labels)


def _golden_min(f: Callable[[float], float], lo: float, hi: float, steps: int = 80) -> float:
    """The minimiser of a unimodal f on [lo, hi] by golden-section search."""
    golden = (math.sqrt(5) - 1) / 2
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(steps):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2


def fit_temperature(logits: Sequence[float], labels: Sequence[bool]) -> float:
    """The temperature T > 0 minimising the NLL of sigmoid(z / T) (golden-section on log T)."""
    if not logits:
        raise ValueError("need at least one claim to fit a temperature")
    return math.exp(
        _golden_min(lambda t: nll(logits, labels, math.exp(t)), math.log(0.01), math.log(100.0))
    )


def _best_bias(logits: Sequence[float], labels: Sequence[bool], temperature: float) -> float:
    """The bias b minimising the NLL of sigmoid(z / T + b) for a fixed T (Newton; convex)."""
    scaled = [z / temperature for z in logits]
    target = sum(labels)
    b = 0.0
    for _ in range(100):
        probs = [sigmoid(s + b) for s in scaled]
        grad = sum(probs) - target
        curvature = sum(p * (1.0 - p) for p in probs)
        step = grad / max(curvature, 1e-9)
        b = min(max(b - max(min(step, 2.0), -2.0), -BIAS_LIMIT), BIAS_LIMIT)
        if abs(step) < 1e-10:
            break
    return b


def fit_temperature_bias(logits: Sequence[float], labels: Sequence[bool]) -> tuple[float, float]:
    """T > 0 and b minimising the NLL of sigmoid(z / T + b) (Platt scaling of z, with its
    slope kept positive so that calibration never reverses the ranking).

    The NLL is jointly convex in (1/T, b); for each T the best b is found by Newton's
    method, and T by golden-section search on log T over that profile.
    """
    if not logits:
        raise ValueError("need at least one claim to fit a temperature")
    log_t = _golden_min(
        lambda t: nll(logits, labels, math.exp(t), _best_bias(logits, labels, math.exp(t))),
        math.log(0.01),
        math.log(100.0),
    )
    temperature = math.exp(log_t)
    return temperature, _best_bias(logits, labels, temperature)


def report(
    logits: Sequence[float], labels: Sequence[bool], temperature: float = 1.0, bias: float = 0.0
) -> dict[str, float]:
    probs = [calibrated(z, temperature, bias) for z in logits]
    return {
        "n": len(labels),
        "accuracy": round(accuracy(probs, labels), 4),
        "ece": round(ece(probs, labels), 4),
        "brier": round(brier(probs, labels), 4),
        "auroc": round(auroc(logits, labels), 4),
        "nll": round(nll(logits, labels, temperature, bias), 4),
    }
