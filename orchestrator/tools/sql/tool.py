"""The `sql` tool itself: the PostgreSQL pool or the SQLite file, and the executors.

`SqlTool` checks each input against the policy (`policy.check_query`) and runs the
checked text: on PostgreSQL in a READ ONLY transaction with its limits set LOCAL, rows
read through a cursor and cut on the server, the connection reset before it returns to
the pool; on SQLite over a fresh read-only, authorized connection with a progress
handler that stops the query at its deadline or after a fixed amount of work. The
schema's tables and sizes are read once, when the tool starts.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import structlog

from orchestrator.provisioning import WORK_MEM, ensure_sqlite_database
from orchestrator.tools.base import ToolContext, ToolError, ToolRefused
from orchestrator.tools.sql.bounds import DataShape, Limits
from orchestrator.tools.sql.errors import postgres_error, sqlite_error
from orchestrator.tools.sql.policy import (
    MAX_INPUT_CHARS,
    MAX_QUERY_CHARS,
    PG_FUNCTIONS,
    SQLITE_FUNCTIONS,
    SqlPolicy,
    check_query,
    plain_name,
)
from orchestrator.tools.sql.render import MAX_ROW_CHARS, json_rows, render_rows
from orchestrator.tools.sql.sqlite_guard import open_read_only
from services.toolspecs import SQL_MAX_ROWS
from services.toolspecs import SQL_SCHEMA as SCHEMA

log = structlog.get_logger("orchestrator.tools.sql")

_RECONNECT_BACKOFF_S = 5.0
SQLITE_MAX_PROGRESS_CALLS = 200_000  # x 1000 virtual-machine instructions
# Above these sizes, checking a query and rendering a result run in a worker thread.
_INLINE_CHECK_CHARS = 256
_INLINE_RENDER_CHARS = 16_000


class SqlTool:
    """The `sql` tool over PostgreSQL (when a DSN is given) or the shipped SQLite data."""

    def __init__(
        self,
        dsn: str | None,
        sqlite_path: Path | None,
        *,
        statement_timeout_ms: int = 2000,
        lock_timeout_ms: int = 500,
        max_rows: int = SQL_MAX_ROWS,
        pool_size: int = 4,
        schema: str = SCHEMA,
    ) -> None:
        if statement_timeout_ms <= 0 or lock_timeout_ms <= 0 or max_rows <= 0 or pool_size <= 0:
            raise ValueError("timeouts, max_rows and pool_size must be positive")
        self._dsn = dsn
        self._sqlite_path = sqlite_path
        self.statement_timeout_ms = statement_timeout_ms
        self.lock_timeout_ms = lock_timeout_ms
        self.max_rows = max_rows
        self.pool_size = pool_size
        self.schema = plain_name(schema)
        self.backend = "postgres" if dsn else "sqlite"
        self.policy: SqlPolicy | None = None
        self._pool: asyncpg.Pool | None = None
        self._ready = asyncio.Lock()
        self._last_failure = 0.0
        self._sqlite_slots = asyncio.Semaphore(pool_size)
        self._sqlite_other_tables: frozenset[str] = frozenset()

    # ---- lifecycle

    async def start(self) -> None:
        """Open the pool (or the SQLite file) and read the schema; a database that is
        down is logged and retried on the next call, never a startup failure."""
        try:
            await self._ensure_ready()
        except ToolError as exc:
            log.warning(
                "sql database unavailable",
                **{
                    "event.action": "sql.start",
                    "event.outcome": "failure",
                    "labels.backend": self.backend,
                    "error.message": str(exc),
                },
            )

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _ensure_ready(self) -> SqlPolicy:
        if self.policy is not None:
            return self.policy
        async with self._ready:
            if self.policy is not None:
                return self.policy
            if time.monotonic() - self._last_failure < _RECONNECT_BACKOFF_S:
                raise ToolError("database unavailable; retrying shortly")
            try:
                if self._dsn:
                    self.policy = await self._start_postgres(self._dsn)
                else:
                    self.policy = await asyncio.to_thread(self._start_sqlite)
            except (
                OSError,
                asyncpg.PostgresError,
                asyncpg.InterfaceError,
                sqlite3.Error,
                TimeoutError,
            ) as exc:
                self._last_failure = time.monotonic()
                # The detail (host, port, database, role, file path) stays in the log.
                log.warning(
                    "sql database unavailable",
                    **{
                        "event.action": "sql.connect",
                        "event.outcome": "failure",
                        "labels.backend": self.backend,
                        "error.type": type(exc).__name__,
                        "error.message": str(exc),
                    },
                )
                raise ToolError("database unavailable") from exc
            log.info(
                "sql database ready",
                **{
                    "event.action": "sql.connect",
                    "event.outcome": "success",
                    "labels.backend": self.backend,
                    "labels.tables": ",".join(sorted(self.policy.tables)),
                },
            )
            return self.policy

    async def _start_postgres(self, dsn: str) -> SqlPolicy:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=self.pool_size,
            timeout=5,  # connect timeout, s
            command_timeout=self.statement_timeout_ms / 1000 + 1,
            max_inactive_connection_lifetime=60,
            reset=reset_connection,
            server_settings={"application_name": "reason-sql-tool"},
        )
        try:
            async with pool.acquire() as conn:
                shape = await postgres_shape(conn, self.schema)
        except BaseException:
            await pool.close()
            raise
        if not shape.rows:
            await pool.close()
            raise OSError(f"schema {self.schema} has no readable tables; run `reason db init`")
        self._pool = pool
        return SqlPolicy(
            tables=frozenset(shape.rows),
            columns=frozenset(c for cols in shape.columns.values() for c in cols),
            functions=PG_FUNCTIONS,
            schema=self.schema,
            shape=shape,
            dialect="postgres",
            limits=self._limits(),
        )

    def _limits(self) -> Limits:
        return Limits(fetch_rows=self.max_rows + 1)

    def _start_sqlite(self) -> SqlPolicy:
        path = ensure_sqlite_database(self._sqlite_path)
        self._sqlite_path = path
        db = self._open_sqlite(authorize=False)
        try:
            names = [r[0] for r in db.execute("SELECT name FROM sqlite_master")]
            tables = [
                r[0]
                for r in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%'"
                )
            ]
            self._sqlite_other_tables = frozenset(n.lower() for n in names) - set(tables)
            shape = sqlite_shape(db, tables)
        finally:
            db.close()
        if not tables:
            raise sqlite3.DatabaseError(f"{path} holds no tables")
        return SqlPolicy(
            tables=frozenset(tables),
            columns=frozenset(c for cols in shape.columns.values() for c in cols),
            functions=SQLITE_FUNCTIONS,
            schema=self.schema,
            shape=shape,
            dialect="sqlite",
            limits=self._limits(),
        )

    # ---- calls

    async def __call__(self, input: str, ctx: ToolContext) -> str:
        # Refuse an over-long input before any work on it (the check itself is bounded
        # by the same limit, and runs in a thread above a small size).
        if len(input) > MAX_INPUT_CHARS:
            raise ToolRefused(
                f"query is longer than {MAX_QUERY_CHARS} characters", category="sql_too_complex"
            )
        policy = await self._ensure_ready()
        query = input.strip().rstrip(";").strip()
        if not query:
            raise ToolError("empty query; send one SELECT statement")
        if len(query) > _INLINE_CHECK_CHARS:
            checked = await asyncio.to_thread(check_query, query, policy)
        else:
            checked = check_query(query, policy)
        budget_ms = int(min(self.statement_timeout_ms, max(ctx.timeout_s * 1000 - 50, 50)))
        started = time.perf_counter()
        if self.backend == "postgres":
            texts = await self._run_postgres(checked, budget_ms)
            rendered = await _off_loop(
                sum(len(t) for t in texts) > _INLINE_RENDER_CHARS, self._render_json_rows, texts
            )
        else:
            async with self._sqlite_slots:
                rendered = await asyncio.to_thread(self._run_sqlite, checked, budget_ms)
        text, shown, truncated = rendered
        log.info(
            "sql query answered",
            **{
                "event.action": "sql.query",
                "event.outcome": "success",
                "event.duration": int((time.perf_counter() - started) * 1e9),
                "labels.backend": self.backend,
                "labels.rows": shown,
                "labels.truncated": truncated,
            },
        )
        return text

    def _render_json_rows(self, texts: Sequence[str]) -> tuple[str, int, bool]:
        columns, rows = json_rows(texts)
        return self._render(columns, rows)

    def _render(self, columns: Sequence[str], rows: Sequence[Any]) -> tuple[str, int, bool]:
        return (
            render_rows(columns, rows, self.max_rows),
            min(len(rows), self.max_rows),
            len(rows) > self.max_rows,
        )

    async def _run_postgres(self, sql: str, budget_ms: int) -> list[str]:
        pool = self._pool
        if pool is None:
            raise ToolError("database unavailable")
        # Each row comes back as one JSON text, cut server-side, so that no result can
        # flood this process however large the values the query builds.
        wrapped = f"SELECT left(row_to_json(q)::text, {MAX_ROW_CHARS + 1}) FROM ({sql}) AS q"
        try:
            conn = await pool.acquire(timeout=budget_ms / 1000)
        except TimeoutError as exc:
            raise ToolError(f"database busy: no free connection within {budget_ms} ms") from exc
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise postgres_error(exc, budget_ms) from exc
        try:
            async with conn.transaction(readonly=True):
                await conn.execute(
                    "SELECT set_config('statement_timeout', $1, true), "
                    "set_config('lock_timeout', $2, true), "
                    "set_config('search_path', $3, true), "
                    "set_config('standard_conforming_strings', 'on', true), "
                    "set_config('work_mem', $4, true), "
                    "set_config('hash_mem_multiplier', '1', true), "
                    "set_config('max_parallel_workers_per_gather', '0', true), "
                    "set_config('jit', 'off', true)",
                    f"{budget_ms}ms",
                    f"{self.lock_timeout_ms}ms",
                    f"pg_catalog, {self.schema}, pg_temp",
                    WORK_MEM,
                )
                cursor = await conn.cursor(wrapped)
                texts = await cursor.fetch(self.max_rows + 1)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            raise postgres_error(exc, budget_ms) from exc
        finally:
            await pool.release(conn)
        return [record[0] for record in texts]

    def _open_sqlite(self, *, authorize: bool = True) -> sqlite3.Connection:
        assert self._sqlite_path is not None
        if authorize:
            assert self.policy is not None
        policy = self.policy if authorize else None
        return open_read_only(self._sqlite_path, policy, self._sqlite_other_tables)

    def _run_sqlite(self, sql: str, budget_ms: int) -> tuple[str, int, bool]:
        deadline = time.monotonic() + budget_ms / 1000
        steps = [0]
        max_steps = SQLITE_MAX_PROGRESS_CALLS

        def progress() -> int:
            # Called every 1000 virtual-machine instructions: stop at the deadline or
            # after a fixed amount of work, whichever comes first.
            steps[0] += 1
            return int(steps[0] > max_steps or time.monotonic() > deadline)

        db = self._open_sqlite()
        db.set_progress_handler(progress, 1000)
        try:
            cursor = db.execute(sql)
            columns = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchmany(self.max_rows + 1)
        except sqlite3.Error as exc:
            if steps[0] > max_steps:
                log.warning(
                    "sql query failed",
                    **{
                        "event.action": "sql.query",
                        "event.outcome": "failure",
                        "labels.backend": "sqlite",
                        "error.type": type(exc).__name__,
                        "error.message": "work limit",
                    },
                )
                raise ToolError("query stopped: it did more work than one query may") from exc
            raise sqlite_error(exc, budget_ms) from exc
        finally:
            db.close()
        return self._render(columns, rows)


async def _off_loop(offload: bool, fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if offload else fn(*args)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _slack_rows(count: int) -> int:
    return count + count // 4 + 8


async def postgres_shape(conn: asyncpg.Connection, schema: str) -> DataShape:
    """The readable tables of `schema`: columns, widest values, rows, unique columns."""
    rows = await conn.fetch(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = $1 ORDER BY table_name, ordinal_position",
        schema,
    )
    tables: dict[str, list[str]] = {}
    for r in rows:
        tables.setdefault(r["table_name"], []).append(r["column_name"])
    unique: dict[str, set[str]] = {}
    for r in await conn.fetch(
        "SELECT c.relname, a.attname FROM pg_catalog.pg_index i "
        "JOIN pg_catalog.pg_class c ON c.oid = i.indrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0] "
        "WHERE n.nspname = $1 AND i.indisunique AND i.indnkeyatts = 1 "
        "AND i.indpred IS NULL AND i.indexprs IS NULL",
        schema,
    ):
        unique.setdefault(r["relname"], set()).add(r["attname"])
    columns: dict[str, dict[str, int]] = {}
    counts: dict[str, int] = {}
    for table, cols in tables.items():
        widths = ", ".join(f"coalesce(max(octet_length({_quote_ident(c)}::text)), 0)" for c in cols)
        record = await conn.fetchrow(
            f"SELECT count(*), {widths} FROM {_quote_ident(schema)}.{_quote_ident(table)}"
        )
        assert record is not None
        counts[table] = _slack_rows(int(record[0]))
        columns[table] = {c: int(record[i + 1]) + 16 for i, c in enumerate(cols)}
    return DataShape(
        columns=columns,
        rows=counts,
        unique={t: frozenset(c) for t, c in unique.items() if t in tables},
    )


def sqlite_shape(db: sqlite3.Connection, tables: Sequence[str]) -> DataShape:
    columns: dict[str, dict[str, int]] = {}
    counts: dict[str, int] = {}
    unique: dict[str, frozenset[str]] = {}
    for table in tables:
        info = list(db.execute(f"PRAGMA table_info({_quote_ident(table)})"))
        cols = [c[1] for c in info]
        widths = ", ".join(
            f"coalesce(max(length(CAST({_quote_ident(c)} AS BLOB))), 0)" for c in cols
        )
        record = db.execute(f"SELECT count(*), {widths} FROM {_quote_ident(table)}").fetchone()
        counts[table] = _slack_rows(int(record[0]))
        columns[table] = {c: int(record[i + 1]) + 16 for i, c in enumerate(cols)}
        keys = {c[1] for c in info if c[5] == 1}
        single = set(keys) if len(keys) == 1 else set()  # a one-column primary key
        for index in db.execute(f"PRAGMA index_list({_quote_ident(table)})"):
            if index[2] and not index[4]:  # unique, not partial
                parts = list(db.execute(f"PRAGMA index_info({_quote_ident(index[1])})"))
                if len(parts) == 1 and parts[0][2] is not None:
                    single.add(parts[0][2])
        unique[table] = frozenset(single)
    return DataShape(columns=columns, rows=counts, unique=unique)


async def reset_connection(conn: asyncpg.Connection) -> None:
    """asyncpg's reset plus what it leaves out of DISCARD ALL (its prepared statements
    stay: they are the driver's cache, not session state a query can set)."""
    await conn.reset()
    await conn.execute("RESET ROLE; DISCARD TEMP; DISCARD SEQUENCES")
