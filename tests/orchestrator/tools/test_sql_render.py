"""Rendering results: one pass, bounded by the output cap, truncation marked.

Rendering used to re-serialise the whole result once per dropped row (it meant to drop
a quarter each pass and dropped one), so 200 wide rows cost ~190 full serialisations;
and a single row wider than the cap came back as no rows at all.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.sql import render
from orchestrator.tools.sql.render import MAX_OUTPUT_CHARS, render_rows
from orchestrator.tools.sql.tool import SqlTool


class _CountingJson:
    """Stands in for the json module of the renderer and counts what it serialises."""

    def __init__(self) -> None:
        self.chars = 0
        self.calls = 0

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        text = json.dumps(obj, **kwargs)
        self.calls += 1
        self.chars += len(text)
        return text

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)


def _wide_rows(n: int, cols: int = 8, width: int = 900) -> tuple[list[str], list[tuple[str, ...]]]:
    columns = [f"c{i}" for i in range(cols)]
    return columns, [tuple(f"{r}:" + "x" * width for _ in columns) for r in range(n)]


@pytest.mark.unit
def test_wide_results_are_serialised_about_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _CountingJson()
    monkeypatch.setattr(render, "json", counting)
    columns, rows = _wide_rows(201)
    out = render_rows(columns, rows, 200)
    assert len(out) <= MAX_OUTPUT_CHARS
    # Each row that is looked at is serialised once; only a couple of rows fit, and
    # the rest are never serialised at all. Nothing near 200 x the output.
    assert counting.chars <= 3 * MAX_OUTPUT_CHARS, counting.chars
    assert counting.calls <= 10, counting.calls


@pytest.mark.unit
@pytest.mark.parametrize("n_rows", [1, 3, 20, 21, 22, 50, 199, 200, 201])
def test_output_is_the_longest_prefix_that_fits(n_rows: int) -> None:
    columns, rows = _wide_rows(n_rows, cols=1, width=900)
    out = render_rows(columns, rows, 200)
    assert len(out) <= MAX_OUTPUT_CHARS
    if n_rows == 1:
        assert out == rows[0][0]  # a single value is answered as itself
        return
    parsed = json.loads(out)
    shown = parsed if isinstance(parsed, list) else parsed["rows"]
    # The rows shown are the first ones, in order, unchanged.
    assert [r["c0"] for r in shown] == [row[0] for row in rows[: len(shown)]]
    fits_all = len(json.dumps([{"c0": r[0]} for r in rows[:200]], ensure_ascii=False))
    if n_rows <= 200 and fits_all <= MAX_OUTPUT_CHARS:
        assert isinstance(parsed, list) and len(shown) == n_rows
        return
    assert parsed["truncated"] is True and parsed["row_limit"] == 200
    if len(shown) < min(n_rows, 200):
        assert parsed["output_limit"] == MAX_OUTPUT_CHARS
        # One more row would not have fitted.
        one_more = dict(parsed, rows=[*shown, {"c0": rows[len(shown)][0]}])
        assert len(json.dumps(one_more, ensure_ascii=False)) > MAX_OUTPUT_CHARS


@pytest.mark.unit
def test_row_limit_without_output_limit() -> None:
    out = json.loads(render_rows(["a"], [(i,) for i in range(5)], 3))
    assert out == {"rows": [{"a": 0}, {"a": 1}, {"a": 2}], "truncated": True, "row_limit": 3}
    assert render_rows(["a", "b"], [(1, "x"), (2, None)], 3) == (
        '[{"a": 1, "b": "x"}, {"a": 2, "b": null}]'
    )


@pytest.mark.unit
def test_a_row_wider_than_the_cap_is_shown_with_cut_cells() -> None:
    columns, rows = _wide_rows(3, cols=40, width=990)  # one row: ~40 000 characters
    out = render_rows(columns, rows, 200)
    assert len(out) <= MAX_OUTPUT_CHARS
    parsed = json.loads(out)
    assert parsed["truncated"] is True and parsed["output_limit"] == MAX_OUTPUT_CHARS
    (row,) = parsed["rows"]
    assert list(row) == columns
    for value in row.values():
        assert value.startswith("0:xxx") and value.endswith("…")


@pytest.mark.unit
def test_long_cells_are_cut_and_marked() -> None:
    out = json.loads(render_rows(["s", "j"], [("y" * 5000, [{"k": "v" * 50}] * 100)], 200))
    (row,) = out
    assert len(row["s"]) == 1001 and row["s"].endswith("…")
    assert (
        isinstance(row["j"], str) and row["j"].startswith('[{"k": "vvv') and row["j"].endswith("…")
    )
    assert render_rows(["n"], [(Decimal("2.50"),)], 200) == "2.5"


@pytest.mark.integration
async def test_a_deeply_nested_value_is_an_error_not_a_crash(sample_db: Any) -> None:
    nested = "[" * 3000 + "]" * 3000
    tool = SqlTool(sample_db.reader_dsn, None, pool_size=1)
    await tool.start()
    try:
        with pytest.raises(ToolError, match="nested too deeply"):
            await tool(f"SELECT CAST('{nested}' AS json) AS j, 1 AS k", ToolContext(timeout_s=5))
        assert await tool("SELECT count(*) FROM orders", ToolContext(timeout_s=5)) == "48"
    finally:
        await tool.close()


@pytest.mark.unit
@pytest.mark.parametrize("exponent", [5000, 100_000])
def test_a_huge_integral_decimal_is_shown_as_text(exponent: int) -> None:
    # int() of it, then json.dumps, raised past 4300 digits (and int() of 1E+100000 is slow)
    text = render_rows(["n"], [(Decimal(f"1E+{exponent}"),)], 200)
    assert text.startswith("1E+") and str(exponent) in text
    assert render_rows(["n"], [(Decimal("1E+20"),)], 200) == "100000000000000000000"


@pytest.mark.integration
async def test_postgres_numeric_of_5000_digits_is_a_result(sample_db: Any) -> None:
    tool = SqlTool(sample_db.reader_dsn, None, pool_size=1)
    await tool.start()
    try:
        out = await tool("SELECT CAST('1e5000' AS numeric) AS n", ToolContext(timeout_s=5))
        assert isinstance(out, str) and "1E+5000" in out
        assert await tool("SELECT CAST('12' AS numeric) AS n", ToolContext(timeout_s=5)) == "12"
    finally:
        await tool.close()
