"""The `calc` tool: one arithmetic expression, evaluated exactly by `services.arith`.

Earlier step results are names (`s1 * 3`): numbers are used as they are, numeric text is
parsed exactly, and a number followed by a unit (`299792458 m/s`, as the lookup tool
answers) contributes its number. Bounded in time by the evaluator's own bounds (source
length, node count, nesting, exponent and digit count are all checked before the work
is done), so a call finishes in well under a millisecond and needs no thread or process.
"""

from __future__ import annotations

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
    json_number,
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
    return json_number(result)
