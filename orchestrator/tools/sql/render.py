"""The SQL tool's results as text: a single value as itself, otherwise JSON rows.

Numbers stay exact, cells are cut to `MAX_CELL_CHARS`, and the whole answer fits in
`MAX_OUTPUT_CHARS` in one pass, with `{"rows": [...], "truncated": true, "row_limit": N}`
when there were more rows and `"output_limit": C` when rows or cells were cut to fit.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from orchestrator.tools.base import ToolError

MAX_CELL_CHARS = 1000
# Numbers with more integer digits than this are shown as text in E notation.
MAX_EXACT_DIGITS = 1000
MAX_OUTPUT_CHARS = 20_000
MAX_ROW_CHARS = 20_000  # one result row as JSON text; longer rows are refused


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            return str(value)
        if value.adjusted() >= MAX_EXACT_DIGITS:
            return _scientific(value)
        if value == value.to_integral_value():
            return int(value)
        as_float = float(value)
        return as_float if Decimal(repr(as_float)) == value else str(value)
    if isinstance(value, str):
        return value if len(value) <= MAX_CELL_CHARS else value[:MAX_CELL_CHARS] + "…"
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)[: MAX_CELL_CHARS // 2].hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value[:MAX_CELL_CHARS]]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in list(value.items())[:MAX_CELL_CHARS]}
    text = str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "…"


def _scientific(value: Decimal) -> str:
    """A number too long to show exactly as text in E notation, its digits cut to a cell
    (int() of it is slow past thousands of digits, and JSON refuses ints past 4300)."""
    sign, digits, exponent = value.as_tuple()
    kept = len(digits)
    while kept > 1 and digits[kept - 1] == 0:
        kept -= 1
    assert isinstance(exponent, int)  # finite
    text = format(Decimal((sign, digits[:kept], exponent + len(digits) - kept)), "E")
    if len(text) > MAX_CELL_CHARS:
        mantissa, power = text.split("E")
        text = mantissa[: MAX_CELL_CHARS - len(power) - 2] + "…E" + power
    return text


def _parse_int(text: str) -> int | Decimal:
    return int(text) if len(text) <= MAX_EXACT_DIGITS else Decimal(text)


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0) + 1
        seen[name] = count
        out.append(name if count == 1 else f"{name}_{count}")
    return out


def json_rows(texts: Sequence[str]) -> tuple[list[str], list[list[Any]]]:
    """Rows sent as `row_to_json` text -> column names and values (numbers exact)."""
    columns: list[str] = []
    rows: list[list[Any]] = []
    for text in texts:
        if len(text) > MAX_ROW_CHARS:
            raise ToolError(
                f"a result row is longer than {MAX_ROW_CHARS} characters; select fewer or "
                "shorter columns"
            )
        try:
            pairs = json.loads(
                text, parse_float=Decimal, parse_int=_parse_int, object_pairs_hook=_Pairs
            )
            if not columns:
                columns = _unique([key for key, _ in pairs])
            rows.append([_plain(value) for _, value in pairs])
        except RecursionError as exc:  # e.g. '[[[[...]]]]'::json, thousands deep
            raise ToolError("a result value is nested too deeply to show") from exc
    return columns, rows


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key-value pairs, duplicates kept."""


def _plain(value: Any) -> Any:
    if isinstance(value, _Pairs):
        return {str(k): _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _cell(value: Any) -> Any:
    """A cell as a JSON value of bounded size: long text cut, marked with an ellipsis;
    a long array or object becomes its JSON text, cut and marked the same way."""
    plain = _json_value(value)
    if isinstance(plain, list | dict):
        text = json.dumps(plain, ensure_ascii=False)
        if len(text) > MAX_CELL_CHARS:
            return text[:MAX_CELL_CHARS] + "…"
    return plain


def _cut_cell(value: Any, chars: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + "…"
    text = json.dumps(value, ensure_ascii=False)
    return value if len(text) <= chars else text[:chars] + "…"


def render_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    max_rows: int,
    *,
    max_chars: int = MAX_OUTPUT_CHARS,
) -> str:
    """A single value as itself; otherwise JSON rows, marked when truncated.

    One pass: each row is serialised once and appended while it fits in `max_chars`
    (with room kept for the truncation marker). `{"rows": [...], "truncated": true,
    "row_limit": N}` says there were more than N rows; `"output_limit": C` is added
    when rows were left out (or the one row shown has its cells cut) to stay within C
    characters. Cells longer than MAX_CELL_CHARS end in "…".
    """
    more_rows = len(rows) > max_rows
    rows = rows[:max_rows]
    if len(rows) == 1 and len(columns) == 1 and not more_rows:
        raw = rows[0][0]
        value = _json_value(raw)
        if isinstance(value, str):
            return value
        if isinstance(raw, Decimal) and raw.is_finite():
            return format(raw.normalize(), "f")
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
    keys = _unique(list(columns))
    marker = f', "truncated": true, "row_limit": {max_rows}, "output_limit": {max_chars}}}'
    budget = max_chars - len('{"rows": [') - len("]") - len(marker)
    pieces: list[str] = []
    used = 0
    cut = False
    for row in rows:
        cells = [_cell(v) for v in row]
        piece = json.dumps(dict(zip(keys, cells, strict=False)), ensure_ascii=False)
        extra = len(piece) + (2 if pieces else 0)
        if used + extra > budget:
            cut = True
            if not pieces:  # the first row alone is too wide: cut its cells to fit
                share = max(
                    16, (budget - len(json.dumps(keys)) - 8 * len(keys)) // max(1, len(keys))
                )
                cells = [_cut_cell(c, share) for c in cells]
                piece = json.dumps(dict(zip(keys, cells, strict=False)), ensure_ascii=False)
                if len(piece) <= budget:
                    pieces.append(piece)
            break
        pieces.append(piece)
        used += extra
    body = ", ".join(pieces)
    if not cut and not more_rows:
        return f"[{body}]"
    if cut:
        return f'{{"rows": [{body}]{marker}'
    return f'{{"rows": [{body}], "truncated": true, "row_limit": {max_rows}}}'
