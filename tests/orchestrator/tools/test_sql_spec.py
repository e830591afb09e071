"""The SQL tool's spec (`services.toolspecs.SQL`) names the schema as it is provisioned.

The planner only knows the tables and columns the spec lists, so they must be the ones
`orchestrator/data/seed.sql` creates: read back from the DDL itself (SQLite) and from
PostgreSQL's information_schema after `init_database`, in column order.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from orchestrator.provisioning import SCHEMA, seed_sql
from orchestrator.tools.base import ToolContext
from orchestrator.tools.sql.tool import SqlTool
from services.toolspecs import SQL, SQL_MAX_ROWS, SQL_SCHEMA, SQL_TABLES

SampleDatabase = Any  # the `sample_db` fixture of conftest.py


def _ctx() -> ToolContext:
    return ToolContext(trace_id="0" * 32, timeout_s=5.0)


@pytest.mark.unit
def test_the_spec_lists_the_tables_the_seed_creates() -> None:
    db = sqlite3.connect(":memory:")
    db.executescript(seed_sql())
    tables = [
        r[0]
        for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    created = {t: tuple(c[1] for c in db.execute(f"PRAGMA table_info({t})")) for t in tables}
    assert created == SQL_TABLES


@pytest.mark.integration
async def test_the_spec_lists_the_tables_provisioned_on_postgres(
    sample_db: SampleDatabase,
) -> None:
    assert SCHEMA == SQL_SCHEMA
    conn = await asyncpg.connect(sample_db.admin_dsn, timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
            SCHEMA,
        )
    finally:
        await conn.close()
    provisioned: dict[str, list[str]] = {}
    for r in rows:
        provisioned.setdefault(r["table_name"], []).append(r["column_name"])
    assert {t: tuple(c) for t, c in provisioned.items()} == SQL_TABLES


@pytest.mark.unit
def test_the_description_shows_every_table_with_its_columns() -> None:
    assert f"schema {SQL_SCHEMA}" in SQL.description
    for table, columns in SQL_TABLES.items():
        assert f"{table}({', '.join(columns)})" in SQL.description
    assert f"at most {SQL_MAX_ROWS} rows" in SQL.description


@pytest.mark.unit
async def test_the_row_limit_is_the_one_the_spec_states(tmp_path: Path) -> None:
    tool = SqlTool(None, tmp_path / "s.sqlite3")
    await tool.start()
    try:
        out = json.loads(await tool("SELECT a.name FROM countries a, countries b", _ctx()))
    finally:
        await tool.close()
    assert out["truncated"] is True and out["row_limit"] == SQL_MAX_ROWS
