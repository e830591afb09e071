"""The sql tool's engine-level defences, against both backends for real.

- Driver errors reach the caller as fixed messages per kind, never the driver's text
  (which names hosts, roles, databases, paths and catalog internals).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.sql import SqlTool

SampleDatabase = Any  # the `sample_db` fixture of conftest.py


def _ctx(timeout_s: float = 5.0) -> ToolContext:
    return ToolContext(trace_id="0" * 32, timeout_s=timeout_s)


@asynccontextmanager
async def _started(dsn: str | None, path: Path | None = None, **kw: Any) -> AsyncIterator[SqlTool]:
    tool = SqlTool(dsn, path, **kw)
    await tool.start()
    try:
        yield tool
    finally:
        await tool.close()


async def _outcome(tool: SqlTool, query: str) -> str:
    try:
        return await tool(query, _ctx())
    except ToolError as exc:
        return f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------ error text


@pytest.mark.integration
@pytest.mark.security
async def test_connection_errors_name_no_host_role_or_database(sample_db: SampleDatabase) -> None:
    marker = secrets.token_hex(4)
    dsns = [
        f"postgresql://leak_user_{marker}:leak_pw_{marker}@127.0.0.1:1/leak_db_{marker}",
        f"postgresql://leak_role_{marker}@127.0.0.1:5432/{sample_db.name}",
        f"postgresql://postgres@127.0.0.1:5432/leak_db_{marker}",
    ]
    for dsn in dsns:
        tool = SqlTool(dsn, None)
        try:
            with pytest.raises(ToolError) as info:
                await tool("SELECT 1", _ctx())
        finally:
            await tool.close()
        message = str(info.value)
        assert message == "database unavailable", message
        for leak in (marker, "127.0.0.1", "5432", sample_db.name, "postgres"):
            assert leak not in message


@pytest.mark.integration
@pytest.mark.security
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT current_setting('data_directory')", "ToolRefused: permission denied"),
        ("SELECT current_setting('config_file')", "ToolRefused: permission denied"),
        (
            "SELECT 'leak_marker'::int",
            "ToolError: query failed: a value has the wrong format for its type (SQLSTATE 22P02)",
        ),
        (
            "SELECT leak_marker FROM countries",
            "ToolError: query failed: unknown column (SQLSTATE 42703)",
        ),
        (
            "SELECT name + 1 FROM countries",
            "ToolError: query failed: unknown function or "
            "operator, or wrong argument types; add a cast (SQLSTATE 42883)",
        ),
        ("SELECT 1 / 0", "ToolError: query failed: division by zero (SQLSTATE 22012)"),
    ],
)
async def test_postgres_query_errors_are_fixed_messages(
    sample_db: SampleDatabase, query: str, expected: str
) -> None:
    async with _started(sample_db.reader_dsn, None, pool_size=1) as tool:
        assert await _outcome(tool, query) == expected


@pytest.mark.integration
@pytest.mark.security
async def test_step_result_carries_no_driver_detail(sample_db: SampleDatabase) -> None:
    from orchestrator.tools.registry import Tool, ToolRegistry
    from services import toolspecs

    marker = secrets.token_hex(4)
    cases = [
        (
            SqlTool(f"postgresql://leak_role_{marker}@127.0.0.1:5432/{sample_db.name}", None),
            "SELECT 1",
        ),
        (SqlTool(sample_db.reader_dsn, None, pool_size=1), "SELECT current_setting('hba_file')"),
        (SqlTool(sample_db.reader_dsn, None, pool_size=1), f"SELECT '{marker}'::date"),
    ]
    for tool, query in cases:
        registry = ToolRegistry()
        registry.register(Tool(toolspecs.SQL, tool, timeout_s=5.0))
        try:
            outcome = await registry.run("sql", query, _ctx())
        finally:
            await tool.close()
        error = outcome.result.error or ""
        assert outcome.result.status in ("error", "refused"), outcome.result
        for leak in (marker, sample_db.role, sample_db.name, "127.0.0.1", "pg_", "superuser"):
            assert leak not in error, error


@pytest.mark.unit
@pytest.mark.security
async def test_sqlite_errors_are_fixed_messages(tmp_path: Path) -> None:
    blocker = tmp_path / "leak_dir_marker"
    blocker.write_text("a file where a folder should be")
    broken = SqlTool(None, blocker / "sample.sqlite3")
    with pytest.raises(ToolError) as info:
        await broken("SELECT 1", _ctx())
    assert str(info.value) == "database unavailable"
    async with _started(None, tmp_path / "s.sqlite3") as tool:
        assert await _outcome(tool, "SELECT leak_marker FROM countries") == (
            "ToolError: query failed: unknown column"
        )
        assert await _outcome(tool, "SELECT abs(-9223372036854775807 - 1)") == (
            "ToolError: query failed: a number is out of range"
        )
