"""The SQL tool logs in the ECS vocabulary, and its security alerts have the one shape.

Every line the tool (and its provisioning) writes carries only `event.*`, `labels.*`
and `error.*` fields besides the message and level, with an `event.action` of `sql.*`;
a refused query reaches the log as the registry's `SECURITY_ALERT` with exactly the
fields of `orchestrator/sandbox/events.py`, and the tool writes no alert of its own.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator import provisioning
from orchestrator.sandbox import events
from orchestrator.tools.base import ToolContext, ToolError
from orchestrator.tools.registry import Tool, ToolRegistry
from orchestrator.tools.sql import tool as sql_tool
from orchestrator.tools.sql.tool import SqlTool
from services import toolspecs

SampleDatabase = Any  # the `sample_db` fixture of conftest.py
ECS_PREFIXES = ("event.", "labels.", "error.")


def _ctx() -> ToolContext:
    return ToolContext(trace_id="0" * 32, timeout_s=5.0)


def _check_ecs(logs: Sequence[MutableMapping[str, Any]]) -> set[str]:
    """Assert every line is ECS-shaped; return the `event.action`s seen."""
    for entry in logs:
        plain = [k for k in entry if k not in ("event", "log_level")]
        assert all(k.startswith(ECS_PREFIXES) for k in plain), entry
        assert entry["event.action"].startswith("sql."), entry
    return {entry["event.action"] for entry in logs}


async def _failing(tool: SqlTool, query: str) -> None:
    with pytest.raises(ToolError):
        await tool(query, _ctx())


@pytest.mark.unit
async def test_sqlite_tool_lines_are_ecs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("a file where a folder should be")
    with capture_logs() as logs:
        await SqlTool(None, blocker / "s.sqlite3").start()  # unavailable
        tool = SqlTool(None, tmp_path / "s.sqlite3")
        await tool.start()
        await tool("SELECT count(*) FROM orders", _ctx())
        await _failing(tool, "SELECT abs(-9223372036854775807 - 1)")  # a driver error
        monkeypatch.setattr(sql_tool, "SQLITE_MAX_PROGRESS_CALLS", 20)
        await _failing(tool, "SELECT count(*) FROM countries a, countries b, countries c")
        await tool.close()
    assert _check_ecs(logs) == {"sql.start", "sql.connect", "sql.query"}
    outcomes = [(e["event.action"], e.get("event.outcome"), e["log_level"]) for e in logs]
    assert ("sql.query", "success", "info") in outcomes
    assert outcomes.count(("sql.query", "failure", "warning")) == 2
    answered = next(e for e in logs if e.get("event.outcome") == "success" and "labels.rows" in e)
    assert answered["labels.backend"] == "sqlite" and answered["event.duration"] >= 0


@pytest.mark.integration
async def test_postgres_tool_and_provisioning_lines_are_ecs(sample_db: SampleDatabase) -> None:
    with capture_logs() as logs:
        await provisioning.init_database(
            sample_db.admin_dsn, None, reader_role=sample_db.role, schema=provisioning.SCHEMA
        )
        tool = SqlTool(sample_db.reader_dsn, None, pool_size=1)
        await tool.start()
        try:
            await tool("SELECT count(*) FROM orders", _ctx())
            await _failing(tool, "SELECT 1 / 0")
        finally:
            await tool.close()
    assert _check_ecs(logs) == {"sql.provision", "sql.connect", "sql.query"}
    failed = next(e for e in logs if e.get("event.outcome") == "failure")
    assert failed["error.code"] == "22012" and failed["labels.backend"] == "postgres"


@pytest.mark.unit
@pytest.mark.security
async def test_a_refused_query_is_one_alert_of_the_shared_shape(tmp_path: Path) -> None:
    tool = SqlTool(None, tmp_path / "s.sqlite3")
    registry = ToolRegistry()
    registry.register(Tool(toolspecs.SQL, tool, timeout_s=5.0))
    try:
        await tool.start()
        with capture_logs() as logs:
            outcome = await registry.run("sql", "DELETE FROM orders", _ctx())
    finally:
        await tool.close()
    assert outcome.result.status == "error"
    alerts = [e for e in logs if e.get("event.kind") == "alert" or "ALERT" in e["event"]]
    shape = set(events._fields("a", "k", "c", "t", "s", None)) | {"event", "log_level"}
    assert len(alerts) == 1 and set(alerts[0]) == shape, alerts
    assert alerts[0]["event"] == events.SECURITY_ALERT
    assert (alerts[0]["labels.tool"], alerts[0]["labels.category"]) == ("sql", "sql_write")
