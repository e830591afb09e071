"""Exact arithmetic shared by the calc tool and the verifier (services/arith.py)."""

from __future__ import annotations

import time
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.arith import (
    MAX_DIGITS,
    ArithError,
    ArithLimitError,
    UnknownName,
    evaluate,
    format_number,
    numbers_close,
    parse_number,
    parse_quantity,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0.1 + 0.2", Fraction(3, 10)),
        ("1/3 + 1/6", Fraction(1, 2)),
        ("2^10", Fraction(1024)),
        ("2 ** -2", Fraction(1, 4)),
        ("-2 ** 2", Fraction(-4)),
        ("3 × 4 ÷ 6", Fraction(2)),
        ("7 − 10", Fraction(-3)),
        ("7 // 2", Fraction(3)),
        ("-7 // 2", Fraction(-4)),
        ("7 % 3", Fraction(1)),
        ("7.5 % 2", Fraction(3, 2)),
        ("15%", Fraction(3, 20)),
        ("12.5%", Fraction(1, 8)),
        ("20% of 50", Fraction(10)),
        ("15% of 80 + 3", Fraction(15)),
        ("10 / 50%", Fraction(20)),
        ("200 * 15% + 2", Fraction(32)),
        ("1,234 * 2", Fraction(2468)),
        ("1,234,567.5 - 0.5", Fraction(1234567)),
        ("max(1,234)", Fraction(234)),
        ("max(1,234, 5)", Fraction(234)),
        ("$1,200 * 3", Fraction(3600)),
        ("1e3 + 1.5E-2", Fraction("1000.015")),
        ("1_000 + 1", Fraction(1001)),
        ("abs(-3.25)", Fraction(13, 4)),
        ("round(2.5)", Fraction(3)),
        ("round(-2.5)", Fraction(-3)),
        ("round(3.14159, 2)", Fraction(314, 100)),
        ("round(1234, -2)", Fraction(1200)),
        ("floor(-1.5) + ceil(1.2)", Fraction(0)),
        ("min(3, 1/2, 4)", Fraction(1, 2)),
        ("sqrt(16/9)", Fraction(4, 3)),
        ("4 ** 0.5", Fraction(2)),
        ("8 ** (2/3)", Fraction(4)),
        ("(27/8) ** (-1/3)", Fraction(2, 3)),
        ("((((1 + 2))))", Fraction(3)),
        ("0x10 + 0b11", Fraction(19)),
    ],
)
def test_exact_values(expr: str, expected: Fraction) -> None:
    value = evaluate(expr)
    assert isinstance(value, Fraction)
    assert value == expected


def test_point_one_plus_point_two_is_exactly_three_tenths() -> None:
    assert evaluate("0.1 + 0.2") == evaluate("3/10")
    assert evaluate("0.1 + 0.2") != 0.1 + 0.2  # the float sum is not 0.3


@pytest.mark.parametrize("expr", ["sqrt(2)", "2 ** 0.5", "pi * 3 ** 2", "e"])
def test_inexact_operations_return_floats(expr: str) -> None:
    value = evaluate(expr)
    assert isinstance(value, float)


def test_inexact_values_are_right() -> None:
    assert evaluate("sqrt(2)") == pytest.approx(1.4142135623730951)
    assert evaluate("pi * 3 ** 2") == pytest.approx(28.274333882308138)


def test_names_bind_step_results() -> None:
    names = {"s1": 12, "s2": "1,500", "s3": Decimal("0.25"), "s4": Fraction(1, 3), "s5": 2.5}
    assert evaluate("s1 * 3", names) == 36
    assert evaluate("s2 / s1", names) == 125
    assert evaluate("s3 * 4 + s4 * 3", names) == 2
    assert evaluate("s5 * 2", names) == 5
    # A float from an earlier step is the decimal it prints as.
    assert evaluate("s1 + 0.2", {"s1": 0.1}) == Fraction(3, 10)
    with pytest.raises(UnknownName) as info:
        evaluate("s9 + 1", names)
    assert info.value.name == "s9"


def test_non_numeric_names_are_not_bound() -> None:
    with pytest.raises(UnknownName):
        evaluate("s1 + 1", {"s1": "Paris"})
    with pytest.raises(UnknownName):
        evaluate("s1 + 1", {"s1": True})


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("1/0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0", "modulo by zero"),
        ("0 ** -1", "division by zero"),
        ("sqrt(-1)", "negative"),
        ("(-8) ** (1/3)", "not a real number"),
        ("", "empty"),
        ("2 +", "not a valid"),
        ("1, 2", "tuple"),
        ("1 < 2", "comparison"),
        ("x.real", "attribute"),
        ("'a' * 3", "not a number"),
        ("__import__('os')", "unknown function"),
        ("(lambda: 1)()", "unknown function"),
        ("abs(x=1)", "positional"),
        ("round(1, 0.5)", "whole number"),
        ("max()", "arguments"),
        ("1j", "not a number"),
        ("[1][0]", "not allowed"),
    ],
)
def test_errors_are_clear(expr: str, message: str) -> None:
    with pytest.raises(ArithError, match=message):
        evaluate(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "9**9**9",
        "10**10000",
        "2**1001 * 1",
        "(2**999) * (2**999) * (2**999) * (2**999)",
        "(10**900) * (10**900)",
        "(1/3) ** 1000 * (1/7) ** 1000",
        "(" * 200 + "1" + ")" * 200,
        "-" * 1500 + "1",
        "+".join(["1"] * 600),
        "1" * 2100,
        "round(1/3, 100000)",
        "99999999999999 ** 999",
        "1e999999",
        "2.0 ** 0.5 ** -1000",
    ],
)
def test_bounds_are_refused_fast(expr: str) -> None:
    # CPU time of this process, so that a busy machine does not fail the test; computing
    # any of these for real would take far longer than the bound
    start = time.process_time()
    with pytest.raises(ArithLimitError):
        evaluate(expr)
    assert time.process_time() - start < 0.25


def test_large_but_bounded_results_are_exact() -> None:
    value = evaluate("2 ** 1000")
    assert value == 2**1000
    assert len(format_number(value)) == 302
    assert evaluate("(10 ** 999) * 9") == 9 * 10**999


def test_digit_bound_matches_documentation() -> None:
    assert evaluate(f"10 ** {MAX_DIGITS - 1}") == 10 ** (MAX_DIGITS - 1)
    with pytest.raises(ArithLimitError):
        evaluate(f"10 ** {MAX_DIGITS - 1} * 100")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction(42), "42"),
        (7, "7"),
        (Fraction(-5, 2), "-2.5"),
        (Fraction(1, 8), "0.125"),
        (Fraction(1, 3), "0.3333333333 (1/3)"),
        (Fraction(2, 3), "0.6666666667 (2/3)"),
        (Fraction(-1, 3), "-0.3333333333 (-1/3)"),
        (Fraction(22, 7), "3.1428571429 (22/7)"),
        (Fraction(1, 3 * 10**12), "0.0000000000003333333333 (1/3000000000000)"),
        (Decimal("12.50"), "12.5"),
        (2.0, "2"),
        (0.1, "0.1"),
        (1.4142135623730951, "1.4142135623730951"),
    ],
)
def test_format_number(value: object, text: str) -> None:
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("  -3.5 ", Fraction(-7, 2)),
        ("1,234.5", Fraction(2469, 2)),
        ("$12", Fraction(12)),
        ("15%", Fraction(3, 20)),
        ("-3/4", Fraction(-3, 4)),
        ("1.5e-3", Fraction(3, 2000)),
        (".5", Fraction(1, 2)),
        ("0.3333333333 (1/3)", Fraction(1, 3)),
        ("−2", Fraction(-2)),
    ],
)
def test_parse_number(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "12 apples", "1/0", "1,23", "1.2.3", "--1"])
def test_parse_number_refuses_non_numbers(text: str) -> None:
    assert parse_number(text) is None


def test_parse_quantity() -> None:
    assert parse_quantity("299792458 m/s") == (Fraction(299792458), "m/s")
    assert parse_quantity("6.62607015e-34 J s") == (Fraction("6.62607015e-34"), "J s")
    assert parse_quantity("-273.15 °C") == (Fraction("-273.15"), "°C")
    assert parse_quantity("12") == (Fraction(12), "")
    assert parse_quantity("Paris") is None
    assert parse_quantity("12 apples; DROP") is None


def test_numbers_close() -> None:
    assert numbers_close(3.1415926535, 3.141592653589793)
    assert numbers_close("3.1415926535", Fraction(314159265358979, 10**14))
    assert numbers_close(0.1 + 0.2, "0.3")
    assert numbers_close(0, 1e-13)
    assert not numbers_close(1, 1.001)
    assert numbers_close(1, 1.001, rel_tol=0.01)
    assert not numbers_close("abc", 1)
    assert not numbers_close(float("nan"), float("nan"))
    with pytest.raises(ValueError):
        numbers_close(1, 1, rel_tol=-1)


# ------------------------------------------------------------------ properties

_small_fractions = st.fractions(min_value=-(10**6), max_value=10**6, max_denominator=10**4).filter(
    lambda f: f != 0
)


def _literal(f: Fraction) -> str:
    return f"({f.numerator}/{f.denominator})"


@given(a=_small_fractions, b=_small_fractions, c=_small_fractions)
@settings(max_examples=200, deadline=None)
def test_matches_fraction_arithmetic(a: Fraction, b: Fraction, c: Fraction) -> None:
    expr = f"{_literal(a)} + {_literal(b)} * {_literal(c)} - {_literal(a)} / {_literal(c)}"
    assert evaluate(expr) == a + b * c - a / c


@given(a=_small_fractions, n=st.integers(min_value=-20, max_value=20))
@settings(max_examples=100, deadline=None)
def test_integer_powers_are_exact(a: Fraction, n: int) -> None:
    assert evaluate(f"{_literal(a)} ** {n}") == a**n


@given(x=st.decimals(min_value=-(10**9), max_value=10**9, places=6, allow_nan=False))
@settings(max_examples=200, deadline=None)
def test_decimal_literals_are_exact(x: Decimal) -> None:
    assert evaluate(str(x)) == Fraction(x)


@given(f=st.fractions(min_value=-(10**12), max_value=10**12, max_denominator=10**6))
@settings(max_examples=200, deadline=None)
def test_format_then_parse_round_trips(f: Fraction) -> None:
    assert parse_number(format_number(f)) == f


@given(a=st.floats(allow_nan=False, allow_infinity=False), b=st.floats(allow_nan=False))
@settings(max_examples=200, deadline=None)
def test_numbers_close_is_symmetric(a: float, b: float) -> None:
    assert numbers_close(a, b) == numbers_close(b, a)


@given(text=st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_arbitrary_text_never_escapes_arith_error(text: str) -> None:
    try:
        value = evaluate(text)
    except ArithError:
        return
    assert isinstance(value, Fraction | float)
