"""Numbers read out of model and tool output are parsed within bounds: a long exponent, a
long digit string or a long text is refused before any big integer is built."""

from __future__ import annotations

import time
from decimal import Decimal
from fractions import Fraction

import pytest

from services.arith import (
    MAX_DIGITS,
    ArithError,
    ArithLimitError,
    as_fraction,
    evaluate,
    format_number,
    parse_number,
    parse_quantity,
)

pytestmark = [pytest.mark.unit]

# Each of these costs a second or more in Fraction() (1e3000000: about 1 s here, and
# the cost grows faster than the exponent), or raises a ValueError past Python's
# 4300-digit conversion limit.
HUGE = [
    "1e3000000",
    "1e9999",
    "-1e-9999",
    "9" * 1500,
    "0." + "0" * 1200 + "1",
    "1/" + "3" * 1500,
    "1" * 100_000,
    " " * 100_000 + "1",
]


def cpu_s(fn, *args):
    # CPU time of this process, so a busy machine does not fail the bound
    start = time.process_time()
    result = fn(*args)
    return result, time.process_time() - start


@pytest.mark.parametrize("text", HUGE)
def test_huge_numbers_are_refused_fast(text: str) -> None:
    value, took = cpu_s(parse_number, text)
    assert value is None
    assert took < 0.25


@pytest.mark.parametrize("text", ["1e9999 m", "9" * 100_000 + " m", "1e3000000 J s"])
def test_quantities_are_bounded_too(text: str) -> None:
    value, took = cpu_s(parse_quantity, text)
    assert value is None and took < 0.25


def test_numbers_within_the_bound_still_parse() -> None:
    assert parse_number(f"1e{MAX_DIGITS - 1}") == 10 ** (MAX_DIGITS - 1)
    assert parse_number("1.5e-300") == Fraction(15, 10**301)
    assert parse_number("9" * 900) == int("9" * 900)
    assert parse_quantity("6.02214076e23 1/mol") == (Fraction(602214076 * 10**15), "1/mol")


@pytest.mark.parametrize("text", ["1e3000000", "1e-3000000", "1" * 5000])
def test_decimals_are_refused_before_conversion(text: str) -> None:
    start = time.process_time()
    with pytest.raises(ArithLimitError):
        as_fraction(Decimal(text))
    with pytest.raises(ArithLimitError):
        format_number(Decimal(text))
    assert time.process_time() - start < 0.25


def test_a_tiny_fraction_formats_and_reads_back() -> None:
    value = evaluate("1/(3*10**200)")
    text = format_number(value)
    assert text.startswith("3.333333333e-201 (1/3")
    assert parse_number(text) == value


def test_format_number_refuses_numbers_past_the_digit_bound() -> None:
    with pytest.raises(ArithError):
        format_number(Fraction(10**5000))
