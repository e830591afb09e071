from __future__ import annotations

import math

import pytest

from evals.stats import (
    calibration_bins,
    ece_of_calibrated,
    expected_calibration_error,
    percentile,
    wilson_interval,
)

pytestmark = pytest.mark.unit


def test_wilson_matches_reference_values() -> None:
    # Reference: statsmodels proportion_confint(count, nobs, method="wilson").
    lo, hi = wilson_interval(81, 263)
    assert lo == pytest.approx(0.2553, abs=1e-4)
    assert hi == pytest.approx(0.3662, abs=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4)
    assert hi == pytest.approx(0.7634, abs=1e-4)


def test_wilson_edges_stay_inside_unit_interval() -> None:
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0
    assert hi == pytest.approx(3.8415 / (20 + 3.8415), abs=1e-4)  # z^2 / (n + z^2)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0
    assert lo == pytest.approx(20 / (20 + 3.8415), abs=1e-4)
    with pytest.raises(ValueError):
        wilson_interval(0, 0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_wilson_narrows_with_more_trials() -> None:
    small = wilson_interval(5, 10)
    big = wilson_interval(500, 1000)
    assert big[1] - big[0] < small[1] - small[0]
    assert big[0] < 0.5 < big[1]


def test_percentile_linear_interpolation() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert percentile(values, 0) == 15
    assert percentile(values, 100) == 50
    assert percentile(values, 50) == 35
    assert percentile(values, 40) == pytest.approx(29.0)  # numpy.percentile(values, 40)
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    with pytest.raises(ValueError):
        percentile([], 50)


def test_ece_by_hand() -> None:
    # Two bins used out of 15: [0.8, 0.8667) holds 4 items at 0.8 with 2 right,
    # [0.2, 0.2667) holds 2 items at 0.2 with 0 right.
    conf = [0.8, 0.8, 0.8, 0.8, 0.2, 0.2]
    right = [True, True, False, False, False, False]
    expected = 4 / 6 * abs(0.5 - 0.8) + 2 / 6 * abs(0.0 - 0.2)
    assert expected_calibration_error(conf, right) == pytest.approx(expected)


def test_ece_zero_when_calibrated_and_one_when_maximally_wrong() -> None:
    assert expected_calibration_error([1.0, 1.0, 0.0], [True, True, False]) == 0.0
    assert expected_calibration_error([1.0, 0.0], [False, True]) == 1.0


def test_calibration_bins_edges() -> None:
    bins = calibration_bins([0.0, 1 / 15, 0.999, 1.0], [False, True, True, True])
    assert len(bins) == 15
    assert bins[0].count == 1 and bins[1].count == 1
    assert bins[14].count == 2  # 1.0 falls into the last bin
    assert sum(b.count for b in bins) == 4
    assert bins[5].mean_confidence is None and bins[5].accuracy is None
    assert math.isclose(bins[14].mean_confidence or 0, (0.999 + 1.0) / 2)
    with pytest.raises(ValueError):
        calibration_bins([1.5], [True])
    with pytest.raises(ValueError):
        calibration_bins([0.5], [])


def test_the_ece_of_a_calibrated_confidence_shrinks_with_the_items() -> None:
    """The floor is zero for certain confidences, positive for uncertain ones over few
    items, smaller over more items, and reproducible for a seed."""
    assert ece_of_calibrated([0.0, 1.0, 1.0]) == (0.0, 0.0)
    few = ece_of_calibrated([0.5, 0.7, 0.9] * 20, draws=300)
    many = ece_of_calibrated([0.5, 0.7, 0.9] * 2000, draws=30)
    assert 0 < many[0] < few[0] <= few[1] < 0.3
    assert many[0] < 0.02
    assert ece_of_calibrated([0.5, 0.7] * 10, draws=50, seed=3) == ece_of_calibrated(
        [0.5, 0.7] * 10, draws=50, seed=3
    )
    with pytest.raises(ValueError):
        ece_of_calibrated([])
