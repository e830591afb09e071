"""The statistics of the report: Wilson intervals, percentiles, calibration error."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054  # two-sided 95% normal quantile
ECE_BINS = 15


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% by default)."""
    if n <= 0:
        raise ValueError("an interval needs at least one trial")
    if not 0 <= successes <= n:
        raise ValueError("successes must lie in 0..n")
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks.

    Same definition as numpy's default (`method="linear"`, Hyndman & Fan type 7).
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must lie in 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class CalibrationBin:
    lo: float
    hi: float
    count: int
    mean_confidence: float | None
    accuracy: float | None


def calibration_bins(
    confidences: Sequence[float], correct: Sequence[bool], n_bins: int = ECE_BINS
) -> list[CalibrationBin]:
    """Equal-width bins over [0, 1]; bin k holds k/n <= c < (k+1)/n, the last one includes 1."""
    if len(confidences) != len(correct):
        raise ValueError("confidences and outcomes differ in length")
    members: list[list[int]] = [[] for _ in range(n_bins)]
    for i, c in enumerate(confidences):
        if not 0 <= c <= 1:
            raise ValueError(f"confidence {c} outside [0, 1]")
        members[min(int(c * n_bins), n_bins - 1)].append(i)
    bins = []
    for k, idx in enumerate(members):
        conf: float | None
        acc: float | None
        if idx:
            conf = sum(confidences[i] for i in idx) / len(idx)
            acc = sum(bool(correct[i]) for i in idx) / len(idx)
        else:
            conf = acc = None
        bins.append(CalibrationBin(k / n_bins, (k + 1) / n_bins, len(idx), conf, acc))
    return bins


def expected_calibration_error(
    confidences: Sequence[float], correct: Sequence[bool], n_bins: int = ECE_BINS
) -> float:
    """ECE = sum over bins of (bin size / N) * |accuracy(bin) - mean confidence(bin)|."""
    if not confidences:
        raise ValueError("calibration error of no predictions")
    total = len(confidences)
    return sum(
        b.count / total * abs(b.accuracy - b.mean_confidence)
        for b in calibration_bins(confidences, correct, n_bins)
        if b.count and b.accuracy is not None and b.mean_confidence is not None
    )


def ece_of_calibrated(
    confidences: Sequence[float], n_bins: int = ECE_BINS, draws: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """The ECE a perfectly calibrated confidence with these values would measure on this
    many items: the mean and the 95th percentile over `draws` outcome sets, each item
    right with probability equal to its confidence. ECE over few items is biased upwards
    (each bin's accuracy is a noisy estimate), so a measured ECE reads against this
    floor: one near the mean is as calibrated as the sample can show; one above the 95th
    percentile is miscalibrated."""
    if not confidences:
        raise ValueError("calibration error of no predictions")
    rng = random.Random(seed)
    values = sorted(
        expected_calibration_error(confidences, [rng.random() < c for c in confidences], n_bins)
        for _ in range(draws)
    )
    return sum(values) / draws, values[min(draws - 1, math.ceil(0.95 * draws) - 1)]
