"""The `calc` tool: one arithmetic expression, evaluated exactly by `services.arith`.

Earlier step results are names (`s1 * 3`): numbers are used as they are, numeric text is
parsed exactly, and a number followed by a unit (`299792458 m/s`, as the lookup tool
answers) contributes its number. Bounded in time by the evaluator's own bounds (source
length, node count, nesting, exponent and digit count are all checked before the work
is done), so a call finishes in well under a millisecond and needs no thread or process.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import structlog

from orchestrator.tools.base import ToolContext, ToolError
from services.arith import (
    ArithError,
    ArithLimitError,
    Number,
    UnknownName,
    as_fraction,
    evaluate,
    format_number,
    parse_quantity,
)

log = structlog.get_logger(__name__)


def _step_number(value: Any) -> Number | None:
    if isinstance(value, str):
        quantity = parse_quantity(value)
        return None if quantity is None else quantity[0]
    try:
        return as_fraction(value)
    except ArithError:
        return None


async def calc(input: str, ctx: ToolContext) -> int | float | str:
    expr = input.strip()
    names: dict[str, Number] = {}
    unusable: dict[str, Any] = {}
    for key, value in ctx.values.items():
        number = _step_number(value)
        if number is None:
            unusable[key] = value
        else:
            names[key] = number
    try:
        result = evaluate(expr, names)
    except UnknownName as exc:
        if exc.name in unusable:
            shown = str(unusable[exc.name])[:80]
            raise ToolError(f"{exc.name} is not a number: {shown!r}") from exc
        raise ToolError(str(exc)) from exc
    except ArithLimitError as exc:
        log.info(
            "calc input past a limit",
            **{
                "event.action": "tool.calc.limit",
                "error.message": str(exc),
                "labels.input_chars": len(expr),
            },
        )
        raise ToolError(str(exc)) from exc
    except ArithError as exc:
        raise ToolError(str(exc)) from exc
    return _json_number(result)


def _json_number(value: Number) -> int | float | str:
    """Later steps get the result as a number (python steps compute with it): integers as
    int, terminating decimals as float when the float prints as the same decimal (0.3,
    12.5; a later calc step reads it back as exactly that decimal). Anything a float
    would change stays exact text: "0.3333333333 (1/3)", "123456789.123456789"."""
    if isinstance(value, float):
        return value
    if value.denominator == 1:
        return int(value)
    text = format_number(value)
    if "(" not in text:
        as_float = float(text)
        if Fraction(repr(as_float)) == value:
            return as_float
    return text
