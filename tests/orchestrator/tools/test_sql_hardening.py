"""The sql tool's engine-level defences, against both backends for real.

- SQLite runs exactly the text that was checked (PostgreSQL's deparse of the checked
  tree), so comments, brackets and quoting that the two lexers read differently cannot
  hide SQL from the check; the SQLite connection itself is limited.
- The read-only PostgreSQL role carries limits the server enforces, and each call sets
  its own; amplifying queries are refused before they run.
- Driver errors reach the caller as fixed messages per kind, never the driver's text
  (which names hosts, roles, databases, paths and catalog internals).
- Checking a long query, and rendering a large result, do not run on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from orchestrator import provisioning
from orchestrator.tools.base import ToolContext, ToolError, ToolRefused
from orchestrator.tools.sql import policy as sql_policy
from orchestrator.tools.sql import render
from orchestrator.tools.sql import tool as sql_tool
from orchestrator.tools.sql.tool import SqlTool

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


# ------------------------------------------- SQLite runs what was checked


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize(
    "query",
    [
        # PostgreSQL nests comments: all of `/* /* */ , ... -- */` is one comment there,
        # while SQLite ends the comment at the first `*/` and runs the rest.
        "SELECT 1 /* /* */ , typeof(1) -- */",
        "SELECT 1 /* /* */ , (SELECT group_concat(name) FROM countries) AS leak -- */",
    ],
)
async def test_sqlite_runs_the_checked_text_not_the_raw_input(tmp_path: Path, query: str) -> None:
    async with _started(None, tmp_path / "s.sqlite3") as tool:
        assert await tool(query, _ctx()) == "1"


@pytest.mark.unit
@pytest.mark.security
async def test_sqlite_brackets_cannot_hide_code_inside_a_postgres_string(tmp_path: Path) -> None:
    # For PostgreSQL `name['] , typeof(1) AS hidden , name[']` subscripts `name` with a
    # string; for SQLite `[']` is a quoted name, so the "string" would run as code.
    query = "SELECT name['] , typeof(1) AS hidden , name['] FROM countries LIMIT 1"
    async with _started(None, tmp_path / "s.sqlite3") as tool:
        with pytest.raises(ToolRefused) as info:
            await tool(query, _ctx())
    assert info.value.category == "sql_construct"


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize(
    "query",
    [
        "SELECT readfile('/etc/passwd')",
        "SELECT writefile('/tmp/x', 'y')",
        "SELECT fts3_tokenizer('simple')",
        "SELECT load_extension('/tmp/evil.so')",
        "SELECT randomblob(1000000000)",
        "SELECT zeroblob(1000000000)",
        "SELECT sqlite_version()",
        "SELECT edit('x')",
        "SELECT * FROM pragma_table_info('countries')",
        "SELECT * FROM json_each('[1, 2]')",
        "SELECT * FROM generate_series(1, 10)",
        "SELECT length(printf('%*d', 1000000000, 1))",
        "SELECT length(printf('%.*c', 1000000000, 'x'))",
    ],
)
async def test_sqlite_only_functions_are_refused(tmp_path: Path, query: str) -> None:
    async with _started(None, tmp_path / "s.sqlite3") as tool:
        with pytest.raises(ToolRefused) as info:
            await tool(query, _ctx())
    assert info.value.category in ("sql_function", "sql_too_large"), str(info.value)


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize(
    "text",
    [
        "SELECT [name] FROM countries",
        "SELECT `name` FROM countries",
        "SELECT $1",
        "SELECT :a",
        "SELECT @a",
        "SELECT ?",
        "SELECT #a",
        "SELECT E'a\\'b'",
        "SELECT X'41'",
        "SELECT 1 -- comment",
        "SELECT /* comment */ 1",
        "SELECT 1;",
        "SELECT 'unterminated",
        'SELECT "unterminated',
        "SELECT 1abc",
        "SELECT 1 ::int",
        "SELECT \\",
    ],
)
def test_sqlite_token_check_refuses_what_the_lexers_read_differently(text: str) -> None:
    with pytest.raises(ToolRefused, match="SQLite exactly as checked"):
        sql_policy._check_sqlite_tokens(text)


@pytest.mark.unit
def test_sqlite_token_check_passes_deparsed_text() -> None:
    for text in [
        "SELECT 'it''s', \"a\"\"b\", 1.5e3, .5, 2 * -3, x || y FROM t WHERE a <> b AND c >= 1",
        "SELECT count(*) FROM orders o JOIN products p ON p.id = o.product_id",
        "SELECT 'a;b -- /* c */' AS \"x;y\"",
        "SELECT naïve, 'ünïcode' FROM t",
    ]:
        sql_policy._check_sqlite_tokens(text)


@pytest.mark.unit
@pytest.mark.security
async def test_the_text_that_runs_must_parse_back_to_the_checked_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deparser slip (simulated here) cannot make either server run other SQL."""

    class SlippingStream:
        def __call__(self, node: object) -> str:
            return "SELECT name FROM countries"

    async with _started(None, tmp_path / "s.sqlite3") as tool:
        assert tool.policy is not None
        postgres = dataclasses.replace(
            tool.policy, functions=sql_policy.PG_FUNCTIONS, dialect="postgres"
        )
        assert sql_policy.check_query("SELECT capital FROM countries", postgres)
        monkeypatch.setattr(sql_policy, "RawStream", SlippingStream)
        for policy in (postgres, tool.policy):
            with pytest.raises(ToolRefused, match="reads differently"):
                sql_policy.check_query("SELECT capital FROM countries", policy)
        # What does read back the same still runs.
        assert json.loads(await tool("SELECT name FROM countries", _ctx()))[0]["name"]


@pytest.mark.unit
@pytest.mark.security
async def test_sqlite_connection_is_limited_at_the_engine(tmp_path: Path) -> None:
    async with _started(None, tmp_path / "s.sqlite3") as tool:
        db = tool._open_sqlite(authorize=False)
        try:
            assert db.execute("PRAGMA query_only").fetchone() == (1,)
            assert db.execute("PRAGMA trusted_schema").fetchone() == (0,)
            assert db.execute("PRAGMA temp_store").fetchone() == (1,)  # FILE
            assert db.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) == 1_000_000
            assert db.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) == 0
            assert db.getlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH) == 200
            assert db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) == 0
            # The engine caps a value at the limit even with the checker bypassed.
            assert db.execute("SELECT printf('%.*c', 2000000, 'x')").fetchone() == (None,)
            with pytest.raises(sqlite3.DataError, match="too big"):
                db.execute("SELECT replace(printf('%.*c', 600000, 'x'), 'x', 'xx')").fetchall()
        finally:
            db.close()


@pytest.mark.unit
@pytest.mark.security
async def test_sqlite_progress_handler_bounds_work_as_well_as_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_tool, "SQLITE_MAX_PROGRESS_CALLS", 20)  # 20 000 instructions
    async with _started(None, tmp_path / "s.sqlite3", statement_timeout_ms=10_000) as tool:
        started = time.perf_counter()
        with pytest.raises(ToolError, match="more work than one query may"):
            await tool("SELECT count(*) FROM countries a, countries b, countries c", _ctx(20))
        assert time.perf_counter() - started < 5  # stopped by work, not by the 10 s clock
        assert await tool("SELECT count(*) FROM orders", _ctx()) == "48"


# --------------------------------------------------- PostgreSQL limits


@pytest.mark.integration
@pytest.mark.security
@pytest.mark.parametrize(
    "query",
    [
        "SELECT length(format('%50000000s', ''))",
        "SELECT length(CAST('x' AS char(5000000)))",
        "SELECT length("
        + "replace(" * 7
        + "'xxxxxxxxxx'"
        + ", 'x', 'xxxxxxxxxx')" * 6
        + ", 'x', 'x'))",
        "SELECT length(string_agg(a.name, ',')) FROM countries a, countries b, countries c, countries d",
        "SELECT length(a || a || a || a) FROM (SELECT b || b || b || b AS a FROM "
        "(SELECT c || c || c || c AS b FROM (SELECT d || d || d || d AS c FROM "
        "(SELECT e || e || e || e AS d FROM (SELECT format('%1000s', '') AS e) q5) q4) q3) q2) q1",
    ],
    ids=["format-width", "bpchar", "nested-replace", "string_agg-cross-join", "concat-chain"],
)
async def test_postgres_refuses_amplifying_queries(sample_db: SampleDatabase, query: str) -> None:
    async with _started(sample_db.reader_dsn, None, pool_size=1) as tool:
        with pytest.raises(ToolRefused) as info:
            await tool(query, _ctx())
    assert info.value.category == "sql_too_large", str(info.value)


@pytest.mark.integration
@pytest.mark.security
async def test_reader_role_limits_are_in_force(sample_db: SampleDatabase) -> None:
    conn = await asyncpg.connect(sample_db.reader_dsn, timeout=5)
    try:
        shown = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in (
                "statement_timeout",
                "lock_timeout",
                "idle_in_transaction_session_timeout",
                "default_transaction_read_only",
                "work_mem",
                "temp_file_limit",
                "hash_mem_multiplier",
                "max_parallel_workers_per_gather",
                "jit",
            )
        }
    finally:
        await conn.close()
    assert shown == {
        "statement_timeout": "5s",
        "lock_timeout": "1s",
        "idle_in_transaction_session_timeout": "10s",
        "default_transaction_read_only": "on",
        "work_mem": "4MB",
        "temp_file_limit": "64MB",
        "hash_mem_multiplier": "1",
        "max_parallel_workers_per_gather": "0",
        "jit": "off",
    }
    admin = await asyncpg.connect(sample_db.admin_dsn, timeout=5)
    try:
        limit = await admin.fetchval(
            "SELECT rolconnlimit FROM pg_roles WHERE rolname = $1", sample_db.role
        )
    finally:
        await admin.close()
    assert limit == provisioning.ROLE_CONNECTION_LIMIT


@pytest.mark.integration
@pytest.mark.security
async def test_temp_file_limit_stops_a_spilling_query(sample_db: SampleDatabase) -> None:
    """Even with the parser bypassed and work_mem cut, the reader cannot fill the disk."""
    conn = await asyncpg.connect(sample_db.reader_dsn, timeout=5)
    try:
        await conn.execute("SET work_mem = '64kB'")
        with pytest.raises(asyncpg.ConfigurationLimitExceededError, match="temp_file_limit"):
            await conn.fetchval("SELECT count(*) FROM generate_series(1, 10000000)")
        # A superuser-only setting: the reader cannot lift it.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SET temp_file_limit = -1")
    finally:
        await conn.close()


@pytest.mark.integration
async def test_db_init_without_a_superuser_sets_what_it_may_and_warns(
    sample_db: SampleDatabase,
) -> None:
    """temp_file_limit needs a superuser: an admin that may only create roles gets every
    other limit, and a warning instead of a failure."""
    suffix = secrets.token_hex(4)
    admin, database, reader = f"reason_admin_{suffix}", f"reason_db_{suffix}", f"reader_{suffix}"
    superuser = await asyncpg.connect(sample_db.admin_dsn, timeout=5)
    await superuser.execute(f"CREATE ROLE {admin} LOGIN CREATEROLE")
    await superuser.execute(f"CREATE DATABASE {database} OWNER {admin}")
    parts = urlsplit(sample_db.admin_dsn)
    host = parts.netloc.rpartition("@")[2]
    try:
        warnings = await provisioning.init_database(
            urlunsplit(parts._replace(netloc=f"{admin}@{host}", path=f"/{database}")),
            None,
            reader_role=reader,
        )
        assert len(warnings) == 1 and "temp_file_limit" in warnings[0]
        conn = await asyncpg.connect(
            urlunsplit(parts._replace(netloc=f"{reader}@{host}", path=f"/{database}")), timeout=5
        )
        try:
            assert await conn.fetchval("SHOW work_mem") == "4MB"
            assert await conn.fetchval("SHOW max_parallel_workers_per_gather") == "0"
            assert await conn.fetchval("SELECT count(*) FROM countries") == 40
        finally:
            await conn.close()
    finally:
        await superuser.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        await superuser.execute(f"DROP ROLE IF EXISTS {reader}")
        await superuser.execute(f"DROP ROLE IF EXISTS {admin}")
        await superuser.close()


@pytest.mark.integration
@pytest.mark.security
async def test_each_call_sets_its_own_limits(sample_db: SampleDatabase) -> None:
    query = (
        "SELECT current_setting('statement_timeout') AS timeout, "
        "current_setting('work_mem') AS work_mem, "
        "current_setting('hash_mem_multiplier') AS hash_mem, "
        "current_setting('max_parallel_workers_per_gather') AS workers, "
        "current_setting('jit') AS jit, current_setting('transaction_read_only') AS ro"
    )
    async with _started(sample_db.reader_dsn, None, statement_timeout_ms=700, pool_size=1) as tool:
        settings = json.loads(await tool(query, _ctx()))[0]
    assert settings == {
        "timeout": "700ms",
        "work_mem": "4MB",
        "hash_mem": "1",
        "workers": "0",
        "jit": "off",
        "ro": "on",
    }


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

    # Letters first: a marker of hex digits alone can be a valid date ('01390520').
    marker = "zq" + secrets.token_hex(4)
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


# ------------------------------------------------------- the event loop


@pytest.mark.unit
@pytest.mark.security
async def test_long_query_is_checked_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a long query is checked, the loop keeps running other tasks: the check
    (made to wait for a tick of a concurrent task) only finishes if it is in a thread."""
    loop_thread = threading.get_ident()
    ticked = threading.Event()
    seen: list[tuple[bool, bool]] = []
    real_check = sql_policy.check_query

    def waiting_check(query: str, policy: sql_policy.SqlPolicy) -> str:
        on_loop = threading.get_ident() == loop_thread
        if not on_loop:
            ticked.clear()
            ticked.wait(5)  # only a free loop can set this
        seen.append((on_loop, ticked.is_set()))
        return real_check(query, policy)

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticked.set()
            await asyncio.sleep(0.001)

    long_query = (
        "SELECT " + ", ".join(f"upper(name) AS c{i}" for i in range(300)) + " FROM countries"
        " ORDER BY population DESC LIMIT 1"
    )
    assert 256 < len(long_query) < sql_policy.MAX_QUERY_CHARS
    async with _started(None, tmp_path / "s.sqlite3") as tool:
        monkeypatch.setattr(sql_tool, "check_query", waiting_check)
        stop = asyncio.Event()
        tick_task = asyncio.create_task(ticker(stop))
        try:
            out = await tool(long_query, _ctx())
        finally:
            stop.set()
            await tick_task
    assert seen == [(False, True)]
    assert json.loads(out)[0]["c0"] == "INDIA"


@pytest.mark.unit
@pytest.mark.security
async def test_over_long_input_is_refused_before_any_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_parse(text: str) -> Any:
        raise AssertionError("an over-long input reached the parser")

    async with _started(None, tmp_path / "s.sqlite3") as tool:
        monkeypatch.setattr(sql_policy, "parse_sql", no_parse)
        started = time.perf_counter()
        for text in ["SELECT " + "1 + " * 3_000_000 + "1", "SELECT 1" + " " * 50_000_000]:
            with pytest.raises(ToolRefused) as info:
                await tool(text, _ctx())
            assert info.value.category == "sql_too_complex"
            assert "longer than" in str(info.value)
        assert time.perf_counter() - started < 5  # generous: no work proportional to input


@pytest.mark.integration
async def test_large_results_render_off_the_event_loop(
    sample_db: SampleDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    threads: list[bool] = []
    real_render = render.render_rows

    def recording_render(*args: Any, **kwargs: Any) -> str:
        threads.append(threading.get_ident() == loop_thread)
        return real_render(*args, **kwargs)

    monkeypatch.setattr(sql_tool, "render_rows", recording_render)
    async with _started(sample_db.reader_dsn, None, pool_size=1) as tool:
        big = json.loads(await tool("SELECT * FROM countries, generate_series(1, 5) g", _ctx()))
        small = await tool("SELECT count(*) FROM countries", _ctx())
    assert big["truncated"] is True and small == "40"
    assert threads == [False, True]  # the large result off the loop, the single value on it
