"""The calc tool: exact results, names from earlier steps, clear errors, fast bounds."""

from __future__ import annotations

import time

import pytest

from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.calc import calc
from services.toolspecs import CALC

pytestmark = pytest.mark.unit


async def test_exact_decimal_sum() -> None:
    assert await calc("0.1 + 0.2", ToolContext()) == 0.3


async def test_percentages_and_fractions() -> None:
    assert await calc("20% of 50", ToolContext()) == 10
    assert await calc("1/3", ToolContext()) == "0.3333333333 (1/3)"
    assert await calc("(48 / 2) + 15% of 80", ToolContext()) == 36


async def test_spec_example_runs() -> None:
    assert await calc(CALC.example, ToolContext()) == 72


async def test_names_from_step_values() -> None:
    ctx = ToolContext(
        values={
            "s1": 12,
            "s2": "1,500",
            "s3": "299792458 m/s",
            "s4": "0.3333333333 (1/3)",
            "s5": 2.5,
        }
    )
    assert await calc("s1 * 3", ctx) == 36
    assert await calc("s2 / s1", ctx) == 125
    assert await calc("s3 * 2", ctx) == 599584916
    assert await calc("s4 * 3", ctx) == 1
    assert await calc("s5 * 4", ctx) == 10


async def test_results_chain_exactly_between_steps() -> None:
    s1 = await calc("0.1", ToolContext())
    assert s1 == 0.1
    assert await calc("s1 + 0.2", ToolContext(values={"s1": s1})) == 0.3
    thirds = await calc("1/3", ToolContext())
    assert await calc("s1 * 3", ToolContext(values={"s1": thirds})) == 1
    # A decimal that a float would round stays exact text.
    big = await calc("123456789.123456789 * 1", ToolContext())
    assert big == "123456789.123456789"
    assert await calc("s1 * 2", ToolContext(values={"s1": big})) == "246913578.246913578"
    assert await calc("sqrt(2)", ToolContext()) == pytest.approx(1.4142135623730951)


async def test_non_numeric_step_value_is_named_in_the_error() -> None:
    ctx = ToolContext(values={"s1": "Paris"})
    with pytest.raises(ToolError, match="s1 is not a number: 'Paris'"):
        await calc("s1 * 2", ctx)


async def test_unknown_name() -> None:
    with pytest.raises(ToolError, match="unknown name 'apples'"):
        await calc("apples + 1", ToolContext())


@pytest.mark.parametrize(
    "expr", ["", "1/0", "import os", "open('/etc/passwd')", "().__class__", "2 +* 3"]
)
async def test_bad_input_raises_tool_error(expr: str) -> None:
    with pytest.raises(ToolError):
        await calc(expr, ToolContext())


@pytest.mark.parametrize("expr", ["9**9**9", "10**10000", "(" * 500 + "1" + ")" * 500])
async def test_bounds_are_refused_fast(expr: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ToolError):
        await calc(expr, ToolContext())
    assert time.perf_counter() - start < 0.05
