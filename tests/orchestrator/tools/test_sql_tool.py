"""The sql tool against a model talked into attacking it.

Three layers are tested separately and together: the parser check (no database), the
PostgreSQL reader role with the parser bypassed, the transaction and connection reset,
and the SQLite backend's authorizer and read-only open. After the attack suite the
database must be unchanged and no session setting may have leaked into the next call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from orchestrator.provisioning import SCHEMA, build_sqlite_database, init_database, seed_sql
from orchestrator.tools.base import ToolContext, ToolError, ToolRefused
from orchestrator.tools.sql.policy import PG_FUNCTIONS, SqlPolicy, check_query
from orchestrator.tools.sql.render import MAX_OUTPUT_CHARS, render_rows
from orchestrator.tools.sql.tool import SqlTool
from services.toolspecs import SQL as SPEC
from services.toolspecs import SQL_TABLES

SampleDatabase = Any  # the `sample_db` fixture of conftest.py

TABLES = tuple(SQL_TABLES)


def _seed_policy() -> SqlPolicy:
    db = sqlite3.connect(":memory:")
    db.executescript(seed_sql())
    columns = {c[1] for t in TABLES for c in db.execute(f"PRAGMA table_info({t})")}
    return SqlPolicy(tables=frozenset(TABLES), columns=frozenset(columns), functions=PG_FUNCTIONS)


POLICY = _seed_policy()

# (query, category) — refused by the parser check whatever the backend.
REFUSED: list[tuple[str, str]] = [
    # writes, DDL, privileges
    ("INSERT INTO countries VALUES ('X', 'Y', 'Z', 1, 1, 'z')", "sql_write"),
    ("UPDATE products SET price_cents = 0", "sql_write"),
    ("DELETE FROM orders", "sql_write"),
    ("DROP TABLE countries", "sql_write"),
    ("CREATE TABLE x (a int)", "sql_write"),
    ("CREATE TEMP TABLE x AS SELECT 1", "sql_write"),
    ("TRUNCATE orders", "sql_write"),
    ("ALTER TABLE countries ADD COLUMN x int", "sql_write"),
    ("GRANT ALL ON countries TO PUBLIC", "sql_write"),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'", "sql_write"),
    ("MERGE INTO products p USING products q ON p.id = q.id WHEN MATCHED THEN DELETE", "sql_write"),
    ("WITH x AS (DELETE FROM orders RETURNING *) SELECT * FROM x", "sql_write"),
    ("WITH x AS (UPDATE products SET stock = 0 RETURNING id) SELECT count(*) FROM x", "sql_write"),
    (
        "WITH a AS (SELECT 1), b AS (INSERT INTO orders DEFAULT VALUES RETURNING id) SELECT 1",
        "sql_write",
    ),
    ("SELECT * FROM (WITH d AS (DELETE FROM orders RETURNING id) SELECT id FROM d) q", "sql_write"),
    ("SELECT * INTO stolen FROM countries", "sql_write"),
    ("SELECT 1 INTO TEMP t", "sql_write"),
    ("COPY countries TO STDOUT", "sql_write"),
    ("COPY (SELECT 1) TO PROGRAM 'touch /tmp/pwned'", "sql_write"),
    ("COPY countries FROM PROGRAM 'id'", "sql_write"),
    ("SELECT nextval('s')", "sql_function"),
    ("SELECT setval('s', 1)", "sql_function"),
    ("SELECT txid_current()", "sql_function"),
    # session settings and roles
    ("SET statement_timeout = 0", "sql_session"),
    ("SET ROLE postgres", "sql_session"),
    ("SET SESSION AUTHORIZATION postgres", "sql_session"),
    ("RESET ALL", "sql_session"),
    ("SHOW work_mem", "sql_session"),
    ("DISCARD ALL", "sql_session"),
    ("BEGIN", "sql_session"),
    ("COMMIT", "sql_session"),
    ("SELECT set_config('statement_timeout', '0', false)", "sql_function"),
    ("SELECT pg_catalog.set_config('default_transaction_read_only', 'off', false)", "sql_function"),
    # locks
    ("LOCK TABLE countries IN ACCESS EXCLUSIVE MODE", "sql_lock"),
    ("SELECT * FROM countries FOR UPDATE", "sql_lock"),
    ("SELECT * FROM products FOR SHARE", "sql_lock"),
    ("SELECT * FROM orders FOR NO KEY UPDATE SKIP LOCKED", "sql_lock"),
    ("SELECT pg_advisory_lock(1)", "sql_function"),
    ("SELECT pg_try_advisory_xact_lock(1)", "sql_function"),
    # sleeping
    ("SELECT pg_sleep(10)", "sql_function"),
    ("SELECT pg_sleep_for('10 seconds')", "sql_function"),
    ("SELECT pg_sleep_until(now() + interval '10 seconds')", "sql_function"),
    ("SELECT name FROM countries WHERE pg_sleep(1) IS NULL", "sql_function"),
    ("SELECT pg_catalog.pg_sleep(10)", "sql_function"),
    ('SELECT "pg_sleep"(10)', "sql_function"),
    ("SELECT PG_SLEEP(10)", "sql_function"),
    ('SELECT U&"\\0070g_sleep"(10)', "sql_function"),
    ("SELECT * FROM countries, LATERAL ROWS FROM (pg_sleep(5)) s", "sql_function"),
    # files, programs, large objects, network
    ("SELECT pg_read_file('/etc/passwd')", "sql_function"),
    ("SELECT pg_read_binary_file('/etc/passwd')", "sql_function"),
    ("SELECT * FROM pg_ls_dir('.')", "sql_function"),
    ("SELECT pg_stat_file('postgresql.conf')", "sql_function"),
    ("SELECT lo_import('/etc/passwd')", "sql_function"),
    ("SELECT lo_export(1, '/tmp/x')", "sql_function"),
    ("SELECT dblink_connect('host=evil.example')", "sql_function"),
    ("SELECT query_to_xml('SELECT * FROM pg_authid', true, true, '')", "sql_function"),
    ("SELECT public.evil()", "sql_function"),
    ("SELECT 1 OPERATOR(public.+) 2", "sql_function"),
    # other statements
    ("EXPLAIN ANALYZE SELECT * FROM countries", "sql_statement"),
    ("DO $$ BEGIN PERFORM pg_sleep(10); END $$", "sql_statement"),
    ("CALL p()", "sql_statement"),
    ("LISTEN ch", "sql_statement"),
    ("NOTIFY ch, 'x'", "sql_statement"),
    ("SELECT pg_notify('ch', 'x')", "sql_function"),
    ("PREPARE q AS SELECT 1", "sql_statement"),
    ("VACUUM countries", "sql_write"),
    ("LOAD 'plpgsql'", "sql_statement"),
    ("SELECT pg_terminate_backend(1)", "sql_function"),
    ("SELECT pg_cancel_backend(1)", "sql_function"),
    ("SELECT pg_reload_conf()", "sql_function"),
    # several statements, however disguised
    ("SELECT 1; DROP TABLE countries", "sql_multi_statement"),
    ("SELECT 1; SELECT 2", "sql_multi_statement"),
    ("SELECT 1 /* x */; /* */ DELETE FROM orders", "sql_multi_statement"),
    ("SELECT 'a'';'; DROP TABLE countries; --'", "sql_multi_statement"),
    ("SELECT $q$;$q$; DROP TABLE countries", "sql_multi_statement"),
    # system catalogs and other schemas
    ("SELECT * FROM pg_shadow", "sql_relation"),
    ("SELECT rolname, rolpassword FROM pg_authid", "sql_relation"),
    ("SELECT * FROM pg_catalog.pg_class", "sql_relation"),
    ("SELECT * FROM information_schema.tables", "sql_relation"),
    ("SELECT * FROM public.anything", "sql_relation"),
    ("SELECT * FROM pg_temp.countries", "sql_relation"),
    ("SELECT * FROM otherdb.reason_data.countries", "sql_relation"),
    (
        "WITH a AS (SELECT * FROM pg_shadow), pg_shadow AS (SELECT 1) SELECT * FROM a",
        "sql_relation",
    ),
    (
        "SELECT * FROM pg_authid, (WITH pg_authid AS (SELECT 1 AS x) SELECT x FROM pg_authid) q",
        "sql_relation",
    ),
    # casts and constructs outside a plain query
    ("SELECT 'pg_sleep'::regproc", "sql_construct"),
    ("SELECT 'countries'::regclass", "sql_construct"),
    ("SELECT '<a/>'::xml", "sql_construct"),
    ("SELECT xmlparse(document '<a/>')", "sql_construct"),
    ("SELECT $1", "sql_construct"),
    ("SELECT * FROM countries TABLESAMPLE SYSTEM (50)", "sql_construct"),
    # amplifiers left off the allowlist
    ("SELECT repeat('x', 100000000)", "sql_function"),
    ("SELECT lpad('x', 100000000)", "sql_function"),
]


def _id(case: tuple[str, str]) -> str:
    return case[0][:50]


# ----------------------------------------------------------------- the parser


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize("case", REFUSED, ids=_id)
def test_parser_refuses(case: tuple[str, str]) -> None:
    sql, category = case
    with pytest.raises(ToolRefused) as info:
        check_query(sql, POLICY)
    assert info.value.category == category, str(info.value)


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT c.pg_read_file FROM countries c",
        "SELECT (c).pg_read_file FROM countries c",
        "SELECT c.query_to_xml FROM countries c",
        "SELECT c.pg_sleep FROM countries c",
    ],
)
def test_function_through_attribute_notation_is_refused(sql: str) -> None:
    with pytest.raises(ToolError, match="unknown column"):
        check_query(sql, POLICY)


@pytest.mark.unit
@pytest.mark.parametrize(
    "sql",
    [
        SPEC.example,
        "SELECT continent, count(*), sum(population) FROM countries GROUP BY continent",
        "SELECT o.id, p.name, o.quantity * p.price_cents AS total_cents FROM orders o "
        "JOIN products p ON p.id = o.product_id WHERE o.status = 'delivered' ORDER BY 3 DESC",
        "WITH big AS (SELECT * FROM countries WHERE population > 100000000) "
        "SELECT count(*) FROM big",
        "WITH RECURSIVE chain(id, manager_id, depth) AS (SELECT id, manager_id, 0 FROM employees "
        "WHERE id = 10 UNION ALL SELECT e.id, e.manager_id, c.depth + 1 FROM employees e "
        "JOIN chain c ON e.id = c.manager_id) SELECT max(depth) FROM chain",
        "SELECT name, rank() OVER (PARTITION BY department ORDER BY salary DESC) FROM employees",
        "SELECT extract(year FROM hire_date), substring(name FROM 1 FOR 3), "
        "trim(both ' ' FROM title), CAST(salary AS numeric(12, 2)) / 12 FROM employees",
        "SELECT x FROM generate_series(1, 3) AS g(x)",
        "VALUES (1, 'a'), (2, 'b')",
        "SELECT * FROM reason_data.countries WHERE name IN (SELECT country FROM orders)",
        "SELECT 1 /*; DROP TABLE countries */",
        "SELECT '; DROP TABLE countries; --'",
        "SELECT $$; DROP TABLE countries; $$",
        "SELECT current_setting('statement_timeout')",
        "SELECT * FROM countries, (WITH pg_authid AS (SELECT 1 AS x) SELECT x FROM pg_authid) q",
        "SELECT q.count FROM (SELECT count(*) FROM orders) q",
        "SELECT c.row_to_json FROM countries c",
    ],
)
def test_parser_allows_plain_queries(sql: str) -> None:
    checked = check_query(sql, POLICY)
    assert checked.upper().startswith(("SELECT", "WITH", "VALUES"))
    assert ";" not in checked.replace("';'", "") or "DROP" in checked  # quoted text only


@pytest.mark.unit
@pytest.mark.security
def test_comments_are_not_sent_to_the_server() -> None:
    assert check_query("SELECT 1 /*; DROP TABLE countries */ -- x", POLICY) == "SELECT 1"


@pytest.mark.unit
def test_invalid_sql_and_unknown_tables_are_plain_errors() -> None:
    with pytest.raises(ToolError, match="not valid SQL") as info:
        check_query("SELEC 1", POLICY)
    assert not isinstance(info.value, ToolRefused)
    with pytest.raises(ToolError, match="unknown table 'customers'") as info:
        check_query("SELECT * FROM customers", POLICY)
    assert not isinstance(info.value, ToolRefused)


@pytest.mark.unit
@pytest.mark.security
def test_oversized_and_deeply_nested_queries_are_refused() -> None:
    with pytest.raises(ToolRefused):
        check_query("SELECT " + "1 + " * 5000 + "1", POLICY)
    with pytest.raises(ToolRefused, match="nested too deeply"):
        check_query("SELECT " + "1 + " * 1900 + "1", POLICY)
    with pytest.raises(ToolRefused, match="nested too deeply"):
        check_query("SELECT " + "(SELECT " * 300 + "1" + ")" * 300, POLICY)
    # Redundant parentheses do not nest the tree: harmless and allowed.
    assert check_query("SELECT " + "(" * 300 + "1" + ")" * 300, POLICY) == "SELECT 1"


@pytest.mark.unit
def test_render_rows() -> None:
    from decimal import Decimal

    assert render_rows(["n"], [(48,)], 200) == "48"
    assert render_rows(["avg"], [(Decimal("122275.000000"),)], 200) == "122275"
    assert render_rows(["name"], [("Paris",)], 200) == "Paris"
    assert render_rows(["x"], [(None,)], 200) == "null"
    assert render_rows(["a", "a"], [(1, 2)], 200) == '[{"a": 1, "a_2": 2}]'
    assert render_rows(["a"], [], 200) == "[]"
    assert render_rows(["j"], [({"k": [1, {"x": None}]},)], 200) == '{"k": [1, {"x": null}]}'

    out = json.loads(render_rows(["a"], [(i,) for i in range(5)], 3))
    assert out == {"rows": [{"a": 0}, {"a": 1}, {"a": 2}], "truncated": True, "row_limit": 3}
    big = render_rows(["s"], [("x" * 900,) for _ in range(100)], 200)
    assert len(big) <= MAX_OUTPUT_CHARS and json.loads(big)["truncated"] is True


# ------------------------------------------------------------- PostgreSQL


async def _connect(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn, timeout=5)


async def _fingerprint(db: SampleDatabase) -> dict[str, Any]:
    """Everything an attack could change: data, relations, the role, locks, sessions."""
    conn = await _connect(db.admin_dsn)
    try:
        data = {
            table: await conn.fetchval(
                f"SELECT count(*)::text || ':' || md5(coalesce(string_agg(t::text, '|' "
                f"ORDER BY t::text), '')) FROM {SCHEMA}.{table} t"
            )
            for table in TABLES
        }
        relations = await conn.fetch(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
            "ORDER BY 1, 2"
        )
        role = await conn.fetchrow(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls, "
            "rolconfig FROM pg_roles WHERE rolname = $1",
            db.role,
        )
        acl = await conn.fetch(
            "SELECT c.relname, c.relacl::text FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1",
            SCHEMA,
        )
        locks = await conn.fetchval(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE a.usename = $1 AND (l.locktype = 'advisory' OR l.mode LIKE '%Exclusive%')",
            db.role,
        )
        stuck = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND state NOT IN ('idle')",
            db.role,
        )
    finally:
        await conn.close()
    return {
        "data": data,
        "relations": [tuple(r) for r in relations],
        "role": dict(role) if role else None,
        "acl": [tuple(r) for r in acl],
        "locks": locks,
        "busy_sessions": stuck,
    }


SETTINGS_QUERY = (
    "SELECT current_user AS usr, current_setting('DateStyle') AS datestyle, "
    "current_setting('TimeZone') AS timezone, current_setting('application_name') AS app, "
    "current_setting('default_transaction_read_only') AS ro_default, "
    "current_setting('transaction_read_only') AS ro, current_setting('search_path') AS path, "
    "current_setting('statement_timeout') AS statement_timeout, "
    "current_setting('lock_timeout') AS lock_timeout, current_setting('work_mem') AS work_mem, "
    "current_setting('IntervalStyle') AS intervalstyle"
)

# Attempts whose outcome depends on the server: each must be refused or stopped.
SERVER_STOPPED = [
    "SELECT count(*) FROM countries a, countries b, countries c, countries d, countries e",
    "SELECT count(*) FROM generate_series(1, 1000000000)",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "SELECT current_setting('data_directory')",
    "SELECT string_agg(md5(x::text), '') FROM generate_series(1, 100000000) x",
]


@pytest.fixture
async def pg_tool(sample_db: SampleDatabase) -> AsyncIterator[SqlTool]:
    tool = SqlTool(sample_db.reader_dsn, None, statement_timeout_ms=400, pool_size=1)
    await tool.start()
    try:
        yield tool
    finally:
        await tool.close()


def _ctx(timeout_s: float = 5.0) -> ToolContext:
    return ToolContext(trace_id="0" * 32, timeout_s=timeout_s)


@pytest.mark.integration
async def test_postgres_answers(pg_tool: SqlTool) -> None:
    top = json.loads(await pg_tool(SPEC.example, _ctx()))
    assert [r["name"] for r in top] == ["India", "China", "United States"]
    assert await pg_tool("SELECT count(*) FROM orders", _ctx()) == "48"
    assert await pg_tool("SELECT capital FROM countries WHERE name = 'France';", _ctx()) == "Paris"
    assert await pg_tool("SELECT avg(salary) FROM employees", _ctx()) == "122275"
    rows = json.loads(await pg_tool("SELECT * FROM orders", _ctx()))
    assert len(rows) == 48 and set(rows[0]) == {
        "id", "customer", "country", "product_id", "quantity", "order_date", "status"
    }  # fmt: skip


@pytest.mark.integration
async def test_postgres_values_are_exact_and_columns_kept(pg_tool: SqlTool) -> None:
    assert await pg_tool("SELECT 0.1 + 0.2", _ctx()) == "0.3"
    assert await pg_tool("SELECT 1 AS a, 2 AS a", _ctx()) == '[{"a": 1, "a_2": 2}]'
    assert json.loads(
        await pg_tool(
            "SELECT name, hire_date FROM employees WHERE id = 1 UNION ALL "
            "SELECT name, hire_date FROM employees WHERE id = 2",
            _ctx(),
        )
    ) == [
        {"name": "Amara Okafor", "hire_date": "2015-03-02"},
        {"name": "Lars Nilsson", "hire_date": "2016-07-11"},
    ]


@pytest.mark.integration
@pytest.mark.security
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT string_agg(name, ',') FROM countries, generate_series(1, 200)",
        "SELECT array_agg(x) FROM generate_series(1, 40000) AS g(x)",
    ],
)
async def test_postgres_huge_values_are_cut_on_the_server(pg_tool: SqlTool, sql: str) -> None:
    """Values within the size bounds but over the row limit are cut by the server."""
    with pytest.raises(ToolError, match="longer than 20000 characters"):
        await pg_tool(sql, _ctx())


@pytest.mark.integration
async def test_postgres_row_limit(sample_db: SampleDatabase) -> None:
    tool = SqlTool(sample_db.reader_dsn, None, max_rows=10, pool_size=1)
    await tool.start()
    try:
        out = json.loads(await tool("SELECT x FROM generate_series(1, 100000) AS g(x)", _ctx()))
    finally:
        await tool.close()
    assert out["truncated"] is True and len(out["rows"]) == 10


@pytest.mark.integration
@pytest.mark.security
@pytest.mark.parametrize("case", REFUSED[::3], ids=_id)
async def test_postgres_refuses(pg_tool: SqlTool, case: tuple[str, str]) -> None:
    sql, category = case
    with pytest.raises(ToolRefused) as info:
        await pg_tool(sql, _ctx())
    assert info.value.category == category


@pytest.mark.integration
@pytest.mark.security
@pytest.mark.parametrize("sql", SERVER_STOPPED, ids=lambda s: s[:50])
async def test_postgres_stops_slow_or_forbidden_queries(pg_tool: SqlTool, sql: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ToolError) as info:
        await pg_tool(sql, _ctx())
    assert time.perf_counter() - start < 2.0  # the 400 ms statement timeout, plus setup
    assert isinstance(info.value, ToolRefused) or "time limit" in str(info.value)


@pytest.mark.integration
@pytest.mark.security
async def test_statement_timeout_follows_the_callers_budget(pg_tool: SqlTool) -> None:
    start = time.perf_counter()
    with pytest.raises(ToolError, match="150 ms time limit"):
        await pg_tool(
            "SELECT count(*) FROM generate_series(1, 1000000) a, generate_series(1, 1000) b",
            _ctx(0.2),
        )
    assert time.perf_counter() - start < 1.5  # generous: the CI machine is shared


@pytest.mark.integration
@pytest.mark.security
async def test_attack_suite_leaves_database_and_session_unchanged(
    sample_db: SampleDatabase, pg_tool: SqlTool
) -> None:
    before = await _fingerprint(sample_db)
    baseline = await pg_tool(SETTINGS_QUERY, _ctx())
    outcomes: dict[str, str] = {}
    harmless = [
        "SELECT 1 /*; DROP TABLE countries */",
        "SELECT 1 /* /* nested */ ; DROP TABLE countries; */",
        "SELECT '; DROP TABLE countries; --'",
        "SELECT E'\\'; DROP TABLE countries; --'",
        "SELECT $$; DROP TABLE countries; $$",
        "SELECT current_setting('search_path')",
    ]
    for sql in [case[0] for case in REFUSED] + SERVER_STOPPED + harmless:
        try:
            await pg_tool(sql, _ctx())
            outcomes[sql] = "answered"
        except ToolRefused as exc:
            outcomes[sql] = f"refused:{exc.category}"
        except ToolError as exc:
            outcomes[sql] = f"error:{exc}"
    # Everything except the harmless single SELECTs was refused or stopped.
    answered = {sql for sql, outcome in outcomes.items() if outcome == "answered"}
    assert answered == set(harmless), answered ^ set(harmless)
    # The database, the role, locks and sessions are as they were...
    assert await _fingerprint(sample_db) == before
    # ...and the next call sees the same session settings as the first.
    assert await pg_tool(SETTINGS_QUERY, _ctx()) == baseline
    settings = json.loads(baseline)[0]
    assert settings["usr"] == sample_db.role
    assert settings["ro"] == "on" and settings["ro_default"] == "on"
    assert settings["path"] == f"pg_catalog, {SCHEMA}, pg_temp"


@pytest.mark.integration
@pytest.mark.security
async def test_connection_is_reset_before_reuse(
    sample_db: SampleDatabase, pg_tool: SqlTool
) -> None:
    """Session state set on a pooled connection outside the parser does not survive."""
    baseline = await pg_tool(SETTINGS_QUERY, _ctx())
    pool = pg_tool._pool
    assert pool is not None
    async with pool.acquire() as conn:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        await conn.execute("SET DateStyle = 'SQL, DMY'")
        await conn.execute("SET TimeZone = 'Asia/Tokyo'")
        await conn.execute("SET application_name = 'leaked'")
        await conn.execute("SET IntervalStyle = 'sql_standard'")
        await conn.execute("SET default_transaction_read_only = off")
        await conn.execute("SELECT pg_advisory_lock(4242)")
        await conn.execute("LISTEN leaked_channel")
        await conn.execute("BEGIN; DECLARE held CURSOR WITH HOLD FOR SELECT 1; COMMIT")
    assert await pg_tool(SETTINGS_QUERY, _ctx()) == baseline
    admin = await _connect(sample_db.admin_dsn)
    try:
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", sample_db.role
            )
            == 1
        )
        assert (
            await admin.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE usename = $1", sample_db.role
            )
            == pid
        )  # the same connection served the next call
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory'", pid
            )
            == 0
        )
    finally:
        await admin.close()
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0
        assert await conn.fetch("SELECT name FROM pg_cursors WHERE name <> ''") == []
        assert await conn.fetchval("SHOW default_transaction_read_only") == "on"


@pytest.mark.integration
@pytest.mark.security
async def test_role_holds_when_the_parser_is_bypassed(sample_db: SampleDatabase) -> None:
    conn = await _connect(sample_db.reader_dsn)
    try:
        assert await conn.fetchval("SHOW default_transaction_read_only") == "on"
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await conn.execute("INSERT INTO countries VALUES ('X', 'Y', 'Z', 1, 1, 'z')")
        # Even with read-only switched off, the role has no right to write anything.
        await conn.execute("SET default_transaction_read_only = off")
        denied = [
            "INSERT INTO countries VALUES ('X', 'Y', 'Z', 1, 1, 'z')",
            "UPDATE products SET price_cents = 0",
            "DELETE FROM orders",
            "TRUNCATE orders",
            "DROP TABLE countries",
            "ALTER TABLE countries ADD COLUMN x int",
            f"CREATE TABLE {SCHEMA}.x (a int)",
            "CREATE TABLE public.x (a int)",
            "CREATE TEMP TABLE x (a int)",
            "CREATE SCHEMA evil",
            "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT pg_ls_dir('.')",
            "SELECT lo_import('/etc/passwd')",
            "COPY (SELECT 1) TO PROGRAM 'true'",
            "COPY countries FROM '/etc/passwd'",
            "SET ROLE postgres",
            "SET SESSION AUTHORIZATION postgres",
            "SELECT * FROM pg_authid",
            "SELECT current_setting('data_directory')",
            "ALTER ROLE postgres PASSWORD 'x'",
        ]
        for sql in denied:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        assert await conn.fetchval("SELECT count(*) FROM countries") == 40
    finally:
        await conn.close()


@pytest.mark.integration
async def test_init_database_is_idempotent(sample_db: SampleDatabase) -> None:
    before = await _fingerprint(sample_db)
    await init_database(sample_db.admin_dsn, None, reader_role=sample_db.role)
    assert await _fingerprint(sample_db) == before


@pytest.mark.integration
@pytest.mark.security
async def test_reader_password_is_set_and_cleared(sample_db: SampleDatabase) -> None:
    async def password() -> str | None:
        conn = await _connect(sample_db.admin_dsn)
        try:
            return await conn.fetchval(
                "SELECT rolpassword FROM pg_authid WHERE rolname = $1", sample_db.role
            )
        finally:
            await conn.close()

    await init_database(
        sample_db.admin_dsn, "s3cret'; DROP ROLE postgres; --", reader_role=sample_db.role
    )
    stored = await password()
    assert stored is not None and stored.startswith("SCRAM-SHA-256$")
    await init_database(sample_db.admin_dsn, None, reader_role=sample_db.role)
    assert await password() is None


@pytest.mark.unit
@pytest.mark.parametrize("name", ["Reader", "a-b", "x; DROP ROLE postgres", "", "a" * 64])
async def test_init_database_refuses_odd_names(name: str) -> None:
    with pytest.raises(ValueError, match="plain lower-case SQL name"):
        await init_database("postgresql://unused@127.0.0.1:1/none", None, reader_role=name)


@pytest.mark.integration
async def test_unreachable_database_is_a_tool_error_not_a_startup_failure() -> None:
    tool = SqlTool("postgresql://nobody@127.0.0.1:1/none", None)
    await tool.start()  # logs and carries on
    with pytest.raises(ToolError, match="database unavailable"):
        await tool("SELECT 1", _ctx())
    await tool.close()


@pytest.mark.integration
async def test_concurrent_calls_share_the_pool(sample_db: SampleDatabase) -> None:
    tool = SqlTool(sample_db.reader_dsn, None, pool_size=2)
    await tool.start()
    try:
        results = await asyncio.gather(
            *(tool(f"SELECT {i} + count(*) FROM orders", _ctx()) for i in range(8))
        )
    finally:
        await tool.close()
    assert results == [str(48 + i) for i in range(8)]


# ----------------------------------------------------------------- SQLite


@pytest.fixture
async def sqlite_tool(tmp_path: Path) -> AsyncIterator[SqlTool]:
    tool = SqlTool(None, tmp_path / "sample.sqlite3", statement_timeout_ms=400)
    await tool.start()
    yield tool
    await tool.close()


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


PORTABLE_QUERIES = [
    SPEC.example,
    "SELECT count(*) FROM orders",
    "SELECT continent, count(*) AS n, sum(population) AS people FROM countries "
    "GROUP BY continent ORDER BY continent",
    "SELECT p.category, sum(o.quantity * p.price_cents) AS revenue_cents FROM orders o "
    "JOIN products p ON p.id = o.product_id WHERE o.status <> 'cancelled' "
    "GROUP BY p.category ORDER BY revenue_cents DESC",
    "SELECT name FROM employees WHERE hire_date >= '2022-01-01' ORDER BY hire_date",
    "SELECT department, max(salary) AS top FROM employees GROUP BY department ORDER BY 1",
]


@pytest.mark.integration
async def test_sqlite_and_postgres_agree(pg_tool: SqlTool, sqlite_tool: SqlTool) -> None:
    for sql in PORTABLE_QUERIES:
        assert await sqlite_tool(sql, _ctx()) == await pg_tool(sql, _ctx()), sql


@pytest.mark.unit
@pytest.mark.security
async def test_sqlite_attack_suite(sqlite_tool: SqlTool) -> None:
    path = sqlite_tool._sqlite_path
    assert path is not None
    digest = _file_digest(path)
    for sql, category in REFUSED:
        with pytest.raises(ToolRefused) as info:
            await sqlite_tool(sql, _ctx())
        assert info.value.category == category, sql
    for sql in [
        "SELECT count(*) FROM countries a, countries b, countries c, countries d, countries e",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    ]:
        start = time.perf_counter()
        with pytest.raises(ToolError, match="time limit"):
            await sqlite_tool(sql, _ctx())
        assert time.perf_counter() - start < 2.0
    assert _file_digest(path) == digest
    assert await sqlite_tool("SELECT count(*) FROM orders", _ctx()) == "48"


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO countries VALUES ('X', 'Y', 'Z', 1, 1, 'z')",
        "DELETE FROM orders",
        "CREATE TABLE x (a int)",
        "DROP TABLE countries",
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA writable_schema = 1",
        "PRAGMA query_only = 0",
        "SELECT * FROM sqlite_master",
        "SELECT load_extension('/tmp/evil')",
        "SELECT randomblob(1000000)",
        "SELECT zeroblob(1000000000)",
        "BEGIN",
    ],
)
async def test_sqlite_authorizer_holds_when_the_parser_is_bypassed(
    sqlite_tool: SqlTool, sql: str
) -> None:
    db = sqlite_tool._open_sqlite()
    try:
        with pytest.raises(sqlite3.DatabaseError, match=r"not authorized|prohibited"):
            db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.mark.unit
@pytest.mark.security
async def test_sqlite_file_is_opened_read_only(sqlite_tool: SqlTool) -> None:
    db = sqlite_tool._open_sqlite(authorize=False)  # even without the authorizer
    try:
        for sql in ["DELETE FROM orders", "CREATE TABLE x (a int)"]:
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                db.execute(sql)
        db.execute("PRAGMA query_only = OFF")
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            db.execute("DELETE FROM orders")
    finally:
        db.close()


@pytest.mark.unit
async def test_sqlite_default_path_is_built_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REASON_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    tool = SqlTool(None, None)
    await tool.start()
    assert await tool("SELECT count(*) FROM countries", _ctx()) == "40"
    # in the project's cache directory (services.settings.default_cache_dir)
    built = list((tmp_path / ".cache" / "reason" / "sql").glob("sample-*.sqlite3"))
    assert len(built) == 1
    digest = _file_digest(built[0])
    again = SqlTool(None, None)
    await again.start()
    assert _file_digest(built[0]) == digest


@pytest.mark.unit
async def test_sqlite_default_path_falls_back_to_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.write_text("a file, so no cache directory can be made under it")
    monkeypatch.delenv("REASON_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    tool = SqlTool(None, None)
    await tool.start()
    assert await tool("SELECT count(*) FROM products", _ctx()) == "24"
    assert list((tmp_path / "tmp" / "reason" / "sql").glob("sample-*.sqlite3"))


@pytest.mark.unit
async def test_sqlite_keeps_a_users_own_file(tmp_path: Path) -> None:
    path = tmp_path / "own.sqlite3"
    build_sqlite_database(path)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO notes (body) VALUES ('kept')")
    db.commit()
    db.close()
    tool = SqlTool(None, path)
    await tool.start()
    assert await tool("SELECT body FROM notes", _ctx()) == "kept"
