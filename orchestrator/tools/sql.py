"""The `sql` tool: read-only queries on the sample database, held against a hostile model.

Independent defences (the first two each enough on its own for writes):

1. **The role.** On PostgreSQL the pool connects as `reason_reader`, created by
   `init_database`: LOGIN, no superuser, CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS,
   member of no role, USAGE on schema `reason_data` and SELECT on its tables only; the
   database's TEMPORARY right and schema `public` are revoked from PUBLIC (the tool's
   database should be the product's own); role defaults `default_transaction_read_only`,
   `statement_timeout`, `lock_timeout`, `idle_in_transaction_session_timeout` and a
   `search_path` of `pg_catalog, reason_data, pg_temp`, and resource limits the server
   enforces: `work_mem`, `hash_mem_multiplier`, no parallel workers, no JIT, and (set
   by a superuser) `temp_file_limit`. On SQLite the file is opened read-only
   (`mode=ro`), with `PRAGMA query_only=ON`, `trusted_schema=OFF`, temporary data on
   disk, length and pattern limits, an authorizer that allows only SELECT, reads of the
   sample tables and an allowlist of functions, and a progress handler that stops a
   query at its deadline or after a fixed amount of work.
2. **The parser.** Exactly one statement, parsed by PostgreSQL's own parser (pglast),
   and only a plain query: every node of the tree must be of an allowed type (so DML,
   DDL, COPY, SET, LOCK, transaction control, LISTEN/NOTIFY, DO, CALL, EXPLAIN, writable
   CTEs, `SELECT ... INTO` and `FOR UPDATE/SHARE` are refused wherever they appear);
   every function call must be on an allowlist of aggregate, window, math, string and
   date functions (so nothing that reads files, reaches the network, sleeps, takes
   locks, touches large objects or sequences, or changes settings can be called); casts
   only to plain types; relations only from the sample schema (or CTEs in scope); no
   function called through attribute notation (`t.row_to_json`). Both backends run the
   deparsed text of the checked tree, never the input, and that text must parse back
   to the same tree, so comments and lexer tricks cannot smuggle anything past the
   check. For SQLite the text must also split into the same tokens under SQLite's
   lexer (no brackets, backticks, parameters, prefixed strings or comments), and
   constructs SQLite reads differently (array subscripts, bit strings) are refused.
3. **The size bounds** (`sql_bounds`). Every value the query can build gets an upper
   bound from the sizes of the sample tables, constant arguments and the rules of each
   allowed function; format() widths, char(n) padding, nested replace(), aggregates
   over cross joins, `x || x` through subqueries, recursive queries whose values grow,
   and generate_series over huge ranges are refused before they run.
4. **The transaction.** Each PostgreSQL call runs in a READ ONLY transaction with
   `statement_timeout` (from the caller's budget), `lock_timeout`, `search_path`,
   `work_mem` and the other limits set LOCAL by the tool (never by the model), reads at
   most `max_rows + 1` rows through a cursor, each row cut to `MAX_ROW_CHARS` on the
   server, and the connection is reset before it returns to the pool (asyncpg's reset:
   advisory locks released, cursors closed, UNLISTEN, RESET ALL; plus RESET ROLE,
   DISCARD TEMP and DISCARD SEQUENCES), so nothing one call sets reaches the next.
   SQLite calls use a fresh read-only connection each time.

Errors: the caller gets a fixed message per kind of failure (syntax, unknown name,
invalid value, permission, time limit, too large, unavailable; with the SQLSTATE on
PostgreSQL); the driver's text, which can name hosts, roles, databases, files and
catalog internals, is only logged. Checking a long query and rendering a large result
run in a worker thread, and input over `MAX_INPUT_CHARS` is refused before any work.

Results: a single value is answered as that value; otherwise a JSON list of row objects,
or `{"rows": [...], "truncated": true, "row_limit": N}` when there were more rows, with
`"output_limit": C` added when rows were left out (or cells cut) to fit C characters.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import math
import os
import re
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

import asyncpg
import structlog
from pglast import ast, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from orchestrator.tools.base import ToolContext, ToolError, ToolRefused
from orchestrator.tools.sql_bounds import (
    DataShape,
    Limits,
    check_bounds,
    check_coverage,
    default_shape,
)

log = structlog.get_logger(__name__)

SCHEMA = "reason_data"
READER_ROLE = "reason_reader"
MAX_QUERY_CHARS = 8000
MAX_TREE_DEPTH = 200
MAX_CELL_CHARS = 1000
# Numbers with more integer digits than this are shown as text in E notation.
MAX_EXACT_DIGITS = 1000
MAX_OUTPUT_CHARS = 20_000
# Role defaults: a backstop if a connection is ever used outside the tool's transaction.
ROLE_STATEMENT_TIMEOUT_MS = 5000
ROLE_LOCK_TIMEOUT_MS = 1000
ROLE_IDLE_IN_TRANSACTION_MS = 10_000
_RECONNECT_BACKOFF_S = 5.0
# Memory a sort or hash may use before spilling to disk (the size bounds count on it).
WORK_MEM = f"{Limits().work_mem_bytes // 1024}kB"
# Role default for the disk a session's temporary files may take (set by a superuser).
ROLE_TEMP_FILE_LIMIT = "64MB"
ROLE_CONNECTION_LIMIT = 32
MAX_ROW_CHARS = 20_000  # one result row as JSON text; longer rows are refused
MAX_INPUT_CHARS = 2 * MAX_QUERY_CHARS  # refused before it is even stripped
SQLITE_MAX_VALUE_BYTES = Limits().max_value_bytes  # SQLITE_LIMIT_LENGTH
SQLITE_MAX_PROGRESS_CALLS = 200_000  # x 1000 virtual-machine instructions
# Above these sizes, checking a query and rendering a result run in a worker thread.
_INLINE_CHECK_CHARS = 256
_INLINE_RENDER_CHARS = 16_000

SPEC: dict[str, Any] = {
    "name": "sql",
    "description": (
        "Run one read-only SQL SELECT on the sample database. Tables: "
        "countries(name, capital, continent, population, area_km2, currency); "
        "products(id, name, category, price_cents, stock); "
        "employees(id, name, department, title, salary, hire_date, manager_id); "
        "orders(id, customer, country, product_id, quantity, order_date, status). "
        "Portable SQL (PostgreSQL syntax, also run on SQLite): joins, GROUP BY, "
        "aggregates, ORDER BY, LIMIT, CTEs. Answers a single value as that value, "
        "otherwise JSON rows (at most 200)."
    ),
    "input_format": "one SQL SELECT statement",
    "example": "SELECT name, population FROM countries ORDER BY population DESC LIMIT 3",
    "timeout_s": 2.0,
    "cache_ttl_s": 60,
}

# ------------------------------------------------------------------ the policy

# Node types a plain read-only query is made of. Anything else is refused.
_ALLOWED_NODES = frozenset(
    {
        "RawStmt",
        "SelectStmt",
        "ResTarget",
        "ColumnRef",
        "A_Star",
        "A_Const",
        "String",
        "Integer",
        "Float",
        "Boolean",
        "BitString",
        "A_Expr",
        "BoolExpr",
        "FuncCall",
        "NamedArgExpr",
        "TypeCast",
        "TypeName",
        "RangeVar",
        "JoinExpr",
        "Alias",
        "SortBy",
        "WithClause",
        "CommonTableExpr",
        "CTESearchClause",
        "CTECycleClause",
        "SubLink",
        "CaseExpr",
        "CaseWhen",
        "CoalesceExpr",
        "MinMaxExpr",
        "NullTest",
        "BooleanTest",
        "A_Indirection",
        "A_Indices",
        "A_ArrayExpr",
        "RangeSubselect",
        "RangeFunction",
        "WindowDef",
        "GroupingSet",
        "GroupingFunc",
        "RowExpr",
        "SQLValueFunction",
        "CollateClause",
    }
)
_WRITE_NODES = frozenset(
    {"InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt", "IntoClause", "CopyStmt"}
)
_STATEMENT_CATEGORY = {
    "InsertStmt": "sql_write",
    "UpdateStmt": "sql_write",
    "DeleteStmt": "sql_write",
    "MergeStmt": "sql_write",
    "CopyStmt": "sql_write",
    "TruncateStmt": "sql_write",
    "LockStmt": "sql_lock",
    "VariableSetStmt": "sql_session",
    "VariableShowStmt": "sql_session",
    "TransactionStmt": "sql_session",
    "DiscardStmt": "sql_session",
}

PG_FUNCTIONS = frozenset(
    {
        # aggregates
        "count", "sum", "avg", "min", "max", "stddev", "stddev_pop", "stddev_samp",
        "variance", "var_pop", "var_samp", "string_agg", "array_agg", "bool_and",
        "bool_or", "every", "percentile_cont", "percentile_disc", "mode", "corr",
        "covar_pop", "covar_samp", "regr_slope", "regr_intercept", "json_agg",
        "jsonb_agg", "json_object_agg", "jsonb_object_agg",
        # window
        "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag",
        "lead", "first_value", "last_value", "nth_value",
        # math
        "abs", "ceil", "ceiling", "floor", "round", "trunc", "sqrt", "cbrt", "power",
        "pow", "exp", "ln", "log", "log10", "mod", "sign", "div", "pi", "degrees",
        "radians", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "width_bucket",
        "gcd", "lcm", "scale",
        # strings
        "lower", "upper", "length", "char_length", "character_length", "octet_length",
        "substr", "substring", "position", "strpos", "trim", "btrim", "ltrim", "rtrim",
        "replace", "concat", "concat_ws", "left", "right", "initcap", "split_part",
        "reverse", "starts_with", "format", "translate", "ascii", "chr", "regexp_replace",
        "regexp_match", "regexp_matches", "regexp_split_to_array", "like_escape",
        "similar_to_escape", "overlay", "to_char", "to_number", "to_date", "to_timestamp",
        # dates and times
        "now", "date_part", "extract", "date_trunc", "age", "make_date", "make_time",
        "make_timestamp", "make_interval", "justify_days", "justify_hours",
        "justify_interval", "timezone", "overlaps", "isfinite", "date_bin",
        # arrays, rows, json
        "generate_series", "unnest", "array_length", "cardinality", "array_to_string",
        "string_to_array", "array_position", "num_nulls", "num_nonnulls", "to_json",
        "to_jsonb", "json_build_object", "jsonb_build_object", "json_build_array",
        "jsonb_build_array", "row_to_json",
        # reading a setting is harmless (protected ones stay protected by the role)
        "current_setting",
    }
)  # fmt: skip
SQLITE_FUNCTIONS = frozenset(
    {
        "count", "sum", "total", "avg", "min", "max", "group_concat", "string_agg",
        "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag",
        "lead", "first_value", "last_value", "nth_value",
        "abs", "round", "ceil", "ceiling", "floor", "trunc", "sqrt", "pow", "power", "exp",
        "ln", "log", "log10", "log2", "mod", "sign", "pi",
        "lower", "upper", "length", "substr", "substring", "trim", "ltrim", "rtrim",
        "replace", "instr", "concat", "concat_ws", "printf", "format", "char", "unicode",
        "like", "glob",
        "coalesce", "ifnull", "nullif", "iif", "typeof",
        "date", "time", "datetime", "julianday", "strftime", "unixepoch",
    }
)  # fmt: skip

_ALLOWED_TYPES = frozenset(
    {
        "int2", "int4", "int8", "smallint", "integer", "int", "bigint", "float4", "float8",
        "real", "numeric", "decimal", "text", "varchar", "bpchar", "char", "bool",
        "boolean", "date", "time", "timetz", "timestamp", "timestamptz", "interval",
        "json", "jsonb",
    }
)  # fmt: skip

_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


check_coverage(PG_FUNCTIONS | SQLITE_FUNCTIONS)


@dataclass(frozen=True)
class SqlPolicy:
    """What a query may touch: the sample tables and columns, and a function allowlist;
    what the tables hold (for the size bounds), and the SQL dialect that will run it."""

    tables: frozenset[str]
    columns: frozenset[str]
    functions: frozenset[str] = PG_FUNCTIONS
    schema: str = SCHEMA
    shape: DataShape | None = None
    dialect: str = "postgres"  # or "sqlite"
    limits: Limits = field(default_factory=Limits)


@dataclass
class _Walk:
    policy: SqlPolicy
    defined: set[str] = field(default_factory=set)


def _sval(node: Any) -> str | None:
    return node.sval if isinstance(node, ast.String) else None


def _names(nodes: Iterable[Any] | None) -> list[str]:
    return [s for s in (_sval(n) for n in nodes or ()) if s is not None]


def _defined_names(node: Any, out: set[str]) -> None:
    """Column and relation names the query itself defines (aliases, CTEs, targets)."""
    for item in _each_node(node):
        if isinstance(item, ast.ResTarget) and item.name:
            out.add(item.name)
        elif isinstance(item, ast.Alias):
            out.add(item.aliasname or "")
            out.update(_names(item.colnames))
        elif isinstance(item, ast.CommonTableExpr):
            out.add(item.ctename or "")
            out.update(_names(item.aliascolnames))


def _refuse_statement(stmt: Any) -> NoReturn:
    kind = type(stmt).__name__
    category = _STATEMENT_CATEGORY.get(kind)
    if category is None:
        category = "sql_write" if kind.endswith("Stmt") and kind not in (
            "ExplainStmt", "ListenStmt", "NotifyStmt", "UnlistenStmt", "DoStmt", "CallStmt",
            "PrepareStmt", "ExecuteStmt", "DeallocateStmt", "CheckPointStmt", "LoadStmt",
        ) else "sql_statement"  # fmt: skip
    label = kind.removesuffix("Stmt") or kind
    raise ToolRefused(f"only a single SELECT query is allowed, not {label}", category=category)


def check_query(sql: str, policy: SqlPolicy) -> str:
    """Check one query against the policy; return the text the server should run.

    Raises `ToolRefused` (a security event, with a category) for anything that is not a
    plain read-only query over the sample tables, and `ToolError` for input that is not
    valid SQL or names an unknown table or column.
    """
    if len(sql) > MAX_QUERY_CHARS:
        raise ToolRefused(
            f"query is longer than {MAX_QUERY_CHARS} characters", category="sql_too_complex"
        )
    if "\x00" in sql:
        raise ToolRefused("query contains a NUL character", category="sql_syntax")
    try:
        stmts = parse_sql(sql)
    except ParseError as exc:
        raise ToolError(f"not valid SQL: {exc}") from exc
    except RecursionError as exc:
        raise ToolRefused("query is nested too deeply", category="sql_too_complex") from exc
    if len(stmts) != 1:
        raise ToolRefused(
            f"exactly one statement is allowed, got {len(stmts)}",
            category="sql_multi_statement" if stmts else "sql_syntax",
        )
    stmt = stmts[0].stmt
    if not isinstance(stmt, ast.SelectStmt):
        _refuse_statement(stmt)
    walk = _Walk(policy)
    _defined_names(stmt, walk.defined)
    _visit(stmt, frozenset(), walk, 0)
    if policy.dialect == "sqlite":
        _for_sqlite(stmt, policy.schema)
    check_bounds(
        stmt,
        policy.shape or default_shape(policy.tables, policy.columns),
        dialect=policy.dialect,
        limits=policy.limits,
    )
    try:
        text = str(RawStream()(stmt))
        # The server runs this text, not the input: it must parse back to the very tree
        # that was checked (a deparser slip must not change what runs).
        again = parse_sql(text)
    except Exception as exc:  # the deparser does not cover every construct
        raise ToolRefused(
            f"query cannot be checked: {type(exc).__name__}", category="sql_construct"
        ) from exc
    if len(again) != 1 or again[0].stmt != stmt:
        raise ToolRefused(
            "query cannot be checked: its normalised text reads differently",
            category="sql_construct",
        )
    if policy.dialect == "sqlite":
        _check_sqlite_tokens(text)
    return text


def _each_node(node: Any, depth: int = 0) -> Iterator[ast.Node]:
    """Every node of a tree, parents first (a parent may change its fields when seen)."""
    if depth > MAX_TREE_DEPTH:
        raise ToolRefused("query is nested too deeply", category="sql_too_complex")
    if isinstance(node, list | tuple):
        for child in node:
            yield from _each_node(child, depth + 1)
    elif isinstance(node, ast.Node):
        yield node
        for attr in node:
            yield from _each_node(getattr(node, attr), depth + 1)


def _for_sqlite(stmt: Any, schema: str) -> None:
    """Refuse what SQLite would read differently from PostgreSQL (brackets are quoted
    names there, x'..' a blob), and drop the sample schema's name, which SQLite lacks."""
    for node in _each_node(stmt):
        if isinstance(node, ast.A_Indirection | ast.A_Indices | ast.A_ArrayExpr):
            raise ToolRefused(
                "arrays and subscripts are not available on the SQLite database",
                category="sql_construct",
            )
        if isinstance(node, ast.BitString):
            raise ToolRefused(
                "bit-string literals are not available on the SQLite database",
                category="sql_construct",
            )
        if isinstance(node, ast.RangeVar) and node.schemaname == schema:
            node.schemaname = None
        elif isinstance(node, ast.ColumnRef):
            fields = node.fields or ()
            if len(fields) == 3 and _sval(fields[0]) == schema:
                node.fields = fields[1:]


_SQLITE_PUNCTUATION = frozenset("(),.+-*/%<>=!|&~^")
_NUMBER_RE = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_" or ord(c) >= 0x80


def _check_sqlite_tokens(text: str) -> None:
    """The deparsed text must split into the same tokens for SQLite as for PostgreSQL:
    plain '...' strings and "..." names (quotes doubled), words, numbers and operator
    characters only. No brackets, backticks, $, ?, :, @, #, ;, backslash escapes,
    prefixed strings (E'', X'', B'', U&'') or comment starts, each of which the two
    lexers read differently."""
    i, n = 0, len(text)
    after_word = False

    def refuse(what: str) -> NoReturn:
        raise ToolRefused(
            f"query cannot be run on SQLite exactly as checked ({what})",
            category="sql_construct",
        )

    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            after_word = False
        elif c in "'\"":
            if after_word:
                refuse("a prefixed or adjacent quoted token")
            j = i + 1
            while True:
                k = text.find(c, j)
                if k < 0:
                    refuse("an unterminated quote")
                if text.startswith(c * 2, k):
                    j = k + 2
                    continue
                break
            i = k + 1
            after_word = True
        elif _word_char(c) and not c.isdigit():
            while i < n and _word_char(text[i]):
                i += 1
            after_word = True
        elif c.isdigit() or (c == "." and text[i + 1 : i + 2].isdigit()):
            match = _NUMBER_RE.match(text, i)
            assert match is not None
            i = match.end()
            if i < n and (_word_char(text[i]) or text[i] in ".'\""):
                refuse("a number run into a word")
            after_word = True
        elif c in _SQLITE_PUNCTUATION:
            if text.startswith(("--", "/*", "*/"), i):
                refuse("a comment")
            i += 1
            after_word = False
        else:
            refuse(f"the character {c!r}")


def _visit(node: Any, scope: frozenset[str], walk: _Walk, depth: int) -> None:
    if depth > MAX_TREE_DEPTH:
        raise ToolRefused("query is nested too deeply", category="sql_too_complex")
    if isinstance(node, list | tuple):
        for child in node:
            _visit(child, scope, walk, depth + 1)
        return
    if not isinstance(node, ast.Node):
        return
    kind = type(node).__name__
    if kind in _WRITE_NODES:
        what = "SELECT ... INTO" if kind == "IntoClause" else kind.removesuffix("Stmt")
        raise ToolRefused(f"writing is not allowed ({what})", category="sql_write")
    if kind == "LockingClause":
        raise ToolRefused("row locks (FOR UPDATE/SHARE) are not allowed", category="sql_lock")
    if kind not in _ALLOWED_NODES:
        if kind.endswith("Stmt"):
            _refuse_statement(node)
        raise ToolRefused(f"{kind} is not allowed in a query", category="sql_construct")

    if isinstance(node, ast.SelectStmt):
        _visit_select(node, scope, walk, depth)
        return
    if isinstance(node, ast.RangeVar):
        _check_relation(node, scope, walk.policy)
        return
    if isinstance(node, ast.FuncCall):
        _check_function(_names(node.funcname), walk.policy)
    elif isinstance(node, ast.TypeName):
        _check_type(_names(node.names))
    elif isinstance(node, ast.ColumnRef):
        _check_column(node, walk)
    elif isinstance(node, ast.A_Indirection):
        # `(t).f` is attribute notation too: only known or query-defined names pass.
        for name in _names(node.indirection):
            known = walk.policy.columns | walk.defined | walk.policy.functions
            if name not in known:
                raise ToolError(f"unknown column {name!r}")
    elif isinstance(node, ast.A_Expr):
        names = _names(node.name)
        if len(names) > 1 and names[0] != "pg_catalog":
            raise ToolRefused(f"operator {'.'.join(names)} is not allowed", category="sql_function")
    for attr in node:
        _visit(getattr(node, attr), scope, walk, depth + 1)


def _visit_select(node: ast.SelectStmt, scope: frozenset[str], walk: _Walk, depth: int) -> None:
    body_scope = scope
    with_clause = node.withClause
    if with_clause is not None:
        ctes = list(with_clause.ctes or ())
        names = [cte.ctename for cte in ctes]
        for i, cte in enumerate(ctes):
            if not isinstance(cte.ctequery, ast.SelectStmt):
                _visit(cte.ctequery, scope, walk, depth + 1)  # refuses it with its category
                _refuse_statement(cte.ctequery)
            # A recursive WITH sees all its names; a plain one only the earlier ones.
            visible = names if with_clause.recursive else names[:i]
            _visit(cte, scope | frozenset(visible), walk, depth + 1)
        body_scope = scope | frozenset(names)
    for attr in node:
        if attr != "withClause":
            _visit(getattr(node, attr), body_scope, walk, depth + 1)


def _check_relation(node: ast.RangeVar, scope: frozenset[str], policy: SqlPolicy) -> None:
    name = node.relname or ""
    qualified = ".".join(p for p in (node.catalogname, node.schemaname, name) if p)
    if node.catalogname or (node.schemaname and node.schemaname != policy.schema):
        raise ToolRefused(
            f"table {qualified} is outside the sample schema", category="sql_relation"
        )
    if node.schemaname is None and name in scope:
        return
    if name in policy.tables:
        return
    if name.startswith("pg_") or name.startswith("sql_") or name in {"information_schema"}:
        raise ToolRefused(f"system table {qualified} is not allowed", category="sql_relation")
    raise ToolError(
        f"unknown table {qualified!r}; the tables are: {', '.join(sorted(policy.tables))}"
    )


def _check_function(names: Sequence[str], policy: SqlPolicy) -> None:
    shown = ".".join(names)
    if len(names) == 2 and names[0] == "pg_catalog":
        names = names[1:]
    if len(names) != 1 or names[0] not in policy.functions:
        raise ToolRefused(
            f"function {shown}() is not allowed (only aggregate, window, math, string and "
            "date functions)",
            category="sql_function",
        )


def _check_type(names: Sequence[str]) -> None:
    shown = ".".join(names)
    if len(names) == 2 and names[0] == "pg_catalog":
        names = names[1:]
    if len(names) != 1 or names[0] not in _ALLOWED_TYPES:
        raise ToolRefused(f"cast to type {shown} is not allowed", category="sql_construct")


def _check_column(node: ast.ColumnRef, walk: _Walk) -> None:
    fields = node.fields or ()
    if len(fields) < 2 or isinstance(fields[-1], ast.A_Star):
        return
    last = _sval(fields[-1])
    # `t.f` may call a function f(t) ("attribute notation"): only known columns, names
    # the query defines, and functions that may be called anyway pass.
    if last is None or last in walk.policy.columns or last in walk.defined:
        return
    if last in walk.policy.functions:
        return
    shown = ".".join(s for s in (_sval(f) for f in fields) if s)
    raise ToolError(f"unknown column {shown!r}")


# -------------------------------------------------------------------- results


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


def _json_rows(texts: Sequence[str]) -> tuple[list[str], list[list[Any]]]:
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


# ------------------------------------------------------------------ the seed


# Role defaults: a backstop for any connection as the reader, with or without the tool.
ROLE_SETTINGS: tuple[tuple[str, str], ...] = (
    ("default_transaction_read_only", "on"),
    ("statement_timeout", f"{ROLE_STATEMENT_TIMEOUT_MS}ms"),
    ("lock_timeout", f"{ROLE_LOCK_TIMEOUT_MS}ms"),
    ("idle_in_transaction_session_timeout", f"{ROLE_IDLE_IN_TRANSACTION_MS}ms"),
    ("work_mem", WORK_MEM),
    ("hash_mem_multiplier", "1"),
    ("max_parallel_workers_per_gather", "0"),
    ("jit", "off"),
)


def seed_sql() -> str:
    return resources.files("orchestrator.data").joinpath("seed.sql").read_text("utf-8")


def _ident(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"not a plain lower-case SQL name: {name!r}")
    return name


async def init_database(
    admin_dsn: str,
    reader_password: str | None,
    *,
    reader_role: str = READER_ROLE,
    schema: str = SCHEMA,
) -> list[str]:
    """Create (or re-create) the sample schema, its data and the read-only role.

    Idempotent: it converges to the shipped seed every time it runs (the schema is
    dropped and re-created in one transaction), so running it twice is harmless. The
    admin DSN needs a role that may create roles and schemas in the target database
    (normally the database owner or a superuser). `reader_password` None leaves the
    reader without a password (trust or peer authentication). Returns warnings for the
    operator (a limit the admin role was not allowed to set).
    """
    role, schema = _ident(reader_role), _ident(schema)
    warnings: list[str] = []
    conn = await asyncpg.connect(admin_dsn, timeout=10)
    try:
        async with conn.transaction():
            # Serialize concurrent runs against the same database.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('reason_data.init'))")
            exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
            if not exists:
                await conn.execute(f"CREATE ROLE {role} LOGIN")
            superuser = await conn.fetchval(
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            )
            if superuser:
                attributes = "NOSUPERUSER NOREPLICATION NOBYPASSRLS "
            else:
                # Only a superuser may change these; a role that has one stays refused.
                flags = await conn.fetchrow(
                    "SELECT rolsuper, rolreplication, rolbypassrls FROM pg_roles "
                    "WHERE rolname = $1",
                    role,
                )
                if flags is not None and any(flags.values()):
                    raise PermissionError(
                        f"role {role} has SUPERUSER, REPLICATION or BYPASSRLS, which only a "
                        "superuser can remove; run `reason db init` as a superuser"
                    )
                attributes = ""
            await conn.execute(
                f"ALTER ROLE {role} WITH LOGIN {attributes}NOCREATEDB NOCREATEROLE NOINHERIT "
                f"CONNECTION LIMIT {ROLE_CONNECTION_LIMIT}"
            )
            password_sql = await conn.fetchval(
                "SELECT CASE WHEN $2::text IS NULL THEN format('ALTER ROLE %I PASSWORD NULL', $1::text)"
                " ELSE format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text) END",
                role,
                reader_password,
            )
            await conn.execute(password_sql)
            for granted in await conn.fetch(
                "SELECT roleid::regrole::text AS name FROM pg_auth_members "
                "WHERE member = $1::regrole",
                role,
            ):
                await conn.execute(f"REVOKE {granted['name']} FROM {role}")
            for setting, value in ROLE_SETTINGS:
                await conn.execute(f"ALTER ROLE {role} SET {setting} = '{value}'")
            # temp_file_limit bounds the disk one session's sorts and hashes may spill
            # to; only a superuser (or a role granted SET on it) may set it.
            try:
                async with conn.transaction():
                    await conn.execute(
                        f"ALTER ROLE {role} SET temp_file_limit = '{ROLE_TEMP_FILE_LIMIT}'"
                    )
            except asyncpg.InsufficientPrivilegeError:
                warnings.append(
                    f"temp_file_limit was not set for {role}: the admin role may not set it; "
                    "run `reason db init` as a superuser to bound the reader's temporary files"
                )
                log.warning("sql_temp_file_limit_not_set", role=role)
            await conn.execute(f"ALTER ROLE {role} SET search_path = pg_catalog, {schema}, pg_temp")

            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            await conn.execute(f"CREATE SCHEMA {schema}")
            await conn.execute(f"SET LOCAL search_path = {schema}")
            await conn.execute(seed_sql())

            database = _ident(await conn.fetchval("SELECT current_database()"))
            for statement in (
                f"REVOKE ALL ON SCHEMA {schema} FROM PUBLIC",
                f"GRANT USAGE ON SCHEMA {schema} TO {role}",
                f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}",
                f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT SELECT ON TABLES TO {role}",
                "REVOKE ALL ON SCHEMA public FROM PUBLIC",
                f"REVOKE ALL ON SCHEMA public FROM {role}",
                f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC",
                f"GRANT CONNECT ON DATABASE {database} TO {role}",
            ):
                await conn.execute(statement)
    finally:
        await conn.close()
    log.info("sql_seed_loaded", schema=schema, role=role)
    return warnings


def _seed_digest() -> str:
    return hashlib.sha256(seed_sql().encode()).hexdigest()


def default_sqlite_path() -> Path:
    return Path.home() / ".cache" / "reason-pipeline" / f"sample-{_seed_digest()[:12]}.sqlite3"


def build_sqlite_database(path: Path) -> None:
    """Write the sample database to `path` (atomically: a temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp)
    try:
        db.executescript(seed_sql())
        db.commit()
    finally:
        db.close()
    os.replace(tmp, path)


# ----------------------------------------------------------------- the tool


class SqlTool:
    """The `sql` tool over PostgreSQL (when a DSN is given) or the shipped SQLite data."""

    def __init__(
        self,
        dsn: str | None,
        sqlite_path: Path | None,
        *,
        statement_timeout_ms: int = 2000,
        lock_timeout_ms: int = 500,
        max_rows: int = 200,
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
        self.schema = _ident(schema)
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
            log.warning("sql_unavailable", backend=self.backend, error=str(exc))

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
                    "sql_unavailable",
                    backend=self.backend,
                    error_type=type(exc).__name__,
                    error=str(exc),
                )
                raise ToolError("database unavailable") from exc
            log.info("sql_ready", backend=self.backend, tables=sorted(self.policy.tables))
            return self.policy

    async def _start_postgres(self, dsn: str) -> SqlPolicy:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=self.pool_size,
            timeout=5,  # connect timeout, s
            command_timeout=self.statement_timeout_ms / 1000 + 1,
            max_inactive_connection_lifetime=60,
            reset=_reset_connection,
            server_settings={"application_name": "reason-sql-tool"},
        )
        try:
            async with pool.acquire() as conn:
                shape = await _postgres_shape(conn, self.schema)
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
        path = self._sqlite_path
        if path is None:
            path = default_sqlite_path()
            try:
                if not path.exists():
                    build_sqlite_database(path)
            except OSError:  # no writable home (e.g. a container user): use the temp dir
                path = Path(tempfile.gettempdir()) / "reason-pipeline" / path.name
                if not path.exists():
                    build_sqlite_database(path)
        elif not path.exists():
            build_sqlite_database(path)
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
            shape = _sqlite_shape(db, tables)
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

    def describe(self) -> str:
        """The tables the tool answers from, for prompts and `reason` commands."""
        if self.policy is None:
            return SPEC["description"]
        return f"{self.backend} tables: " + ", ".join(sorted(self.policy.tables))

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
            "sql_query",
            backend=self.backend,
            rows=shown,
            truncated=truncated,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return text

    def _render_json_rows(self, texts: Sequence[str]) -> tuple[str, int, bool]:
        columns, rows = _json_rows(texts)
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
            raise _postgres_error(exc, budget_ms) from exc
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
            raise _postgres_error(exc, budget_ms) from exc
        finally:
            await pool.release(conn)
        return [record[0] for record in texts]

    def _open_sqlite(self, *, authorize: bool = True) -> sqlite3.Connection:
        assert self._sqlite_path is not None
        uri = f"file:{quote(str(self._sqlite_path.resolve()))}?mode=ro"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA query_only = ON")
        db.execute("PRAGMA trusted_schema = OFF")  # no functions from views or triggers
        db.execute("PRAGMA temp_store = FILE")  # big sorts and ephemeral tables go to disk
        db.execute("PRAGMA cache_size = -2000")  # ~2 MB of page cache
        db.execute("PRAGMA mmap_size = 0")
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, SQLITE_MAX_VALUE_BYTES)
        db.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_QUERY_CHARS * 4)
        db.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        db.setlimit(sqlite3.SQLITE_LIMIT_EXPR_DEPTH, MAX_TREE_DEPTH)
        db.setlimit(sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 50)
        db.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 200)
        db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 0)
        db.setlimit(sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 32)
        db.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, 500)
        db.setlimit(sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH, 0)
        if authorize:
            assert self.policy is not None
            db.set_authorizer(_sqlite_authorizer(self.policy, self._sqlite_other_tables))
        return db

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
                log.warning("sql_query_failed", backend="sqlite", error="work limit")
                raise ToolError("query stopped: it did more work than one query may") from exc
            raise _sqlite_error(exc, budget_ms) from exc
        finally:
            db.close()
        return self._render(columns, rows)


async def _off_loop(offload: bool, fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if offload else fn(*args)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _slack_rows(count: int) -> int:
    return count + count // 4 + 8


async def _postgres_shape(conn: asyncpg.Connection, schema: str) -> DataShape:
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


def _sqlite_shape(db: sqlite3.Connection, tables: Sequence[str]) -> DataShape:
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


# ------------------------------------------------------------------ errors
#
# The driver's own messages can name the server, port, database, roles, settings and
# catalog internals; the caller gets a fixed message per kind of failure (and the
# SQLSTATE, which names only the kind), and the detail goes to the log.

_PG_MESSAGES = {
    "42601": "syntax error",
    "42703": "unknown column",
    "42P01": "unknown table",
    "42883": "unknown function or operator, or wrong argument types; add a cast",
    "42702": "ambiguous column name; qualify it with its table",
    "42803": "grouping error: each selected column must be in GROUP BY or in an aggregate",
    "42804": "type mismatch",
    "42P18": "a value's type is unknown; add a cast",
    "42725": "ambiguous function call; add casts",
    "42P10": "invalid column reference in ORDER BY, GROUP BY or DISTINCT",
    "42P19": "invalid recursive query",
    "42P20": "invalid window function use",
    "42P22": "collation mismatch",
    "42P21": "collation mismatch",
    "42846": "cannot cast between these types",
    "42611": "invalid column definition",
    "21000": "a subquery used as a value returned more than one row",
    "22012": "division by zero",
    "22003": "a number is out of range",
    "22P02": "a value has the wrong format for its type",
    "22007": "invalid date or time format",
    "22008": "date or time out of range",
    "22015": "interval out of range",
    "22023": "invalid argument value",
    "2201E": "invalid argument for a logarithm",
    "2201F": "invalid argument for a power function",
    "2201G": "invalid argument for a width_bucket",
    "22001": "a string is too long for its type",
    "22004": "null value not allowed",
    "22011": "invalid substring",
    "2201B": "invalid regular expression",
    "22019": "invalid escape character",
    "22025": "invalid escape sequence",
    "2202E": "array subscript error",
    "22P05": "untranslatable character",
    "22021": "invalid byte sequence",
    "2200B": "escape character conflict",
    "22026": "string data length mismatch",
    "2202H": "invalid sample size",
}
_PG_CLASS_MESSAGES = {
    "22": "invalid value",
    "42": "invalid query",
    "21": "cardinality violation",
    "0A": "feature not supported",
    "2F": "function error",
    "39": "function error",
    "P0": "function error",
}
_PG_UNAVAILABLE_CLASSES = ("08", "28", "3D", "57", "58", "XX", "53300", "55000", "40")


def _too_big(sqlstate: str) -> ToolError:
    return ToolError(
        "query stopped: it needed more memory, disk or complexity than allowed "
        f"(SQLSTATE {sqlstate}); select fewer rows or shorter values"
    )


def _postgres_error(exc: BaseException, budget_ms: int) -> ToolError:
    sqlstate = getattr(exc, "sqlstate", None) if isinstance(exc, asyncpg.PostgresError) else None
    log.warning(
        "sql_query_failed",
        backend="postgres",
        sqlstate=sqlstate,
        error_type=type(exc).__name__,
        error=str(exc),
        detail=getattr(exc, "detail", None),
        hint=getattr(exc, "hint", None),
    )
    if sqlstate is None:
        if isinstance(exc, TimeoutError):
            return ToolError(f"query stopped: it ran past the {budget_ms} ms time limit")
        return ToolError("database unavailable")
    if sqlstate == "57014":
        return ToolError(f"query stopped: it ran past the {budget_ms} ms time limit")
    if sqlstate == "55P03":
        return ToolError("query stopped: it waited too long for a lock")
    if sqlstate == "42501":
        return ToolRefused("permission denied", category="sql_permission")
    if sqlstate == "25006":
        return ToolRefused("read-only: writing is not allowed", category="sql_write")
    if sqlstate.startswith(_PG_UNAVAILABLE_CLASSES):
        return ToolError("database unavailable")
    if sqlstate.startswith(("53", "54")):
        return _too_big(sqlstate)
    message = _PG_MESSAGES.get(sqlstate) or _PG_CLASS_MESSAGES.get(sqlstate[:2])
    if message is None:
        return ToolError(f"query failed (SQLSTATE {sqlstate})")
    return ToolError(f"query failed: {message} (SQLSTATE {sqlstate})")


_SQLITE_MESSAGES = (
    ("no such column", "unknown column"),
    ("no such table", "unknown table"),
    ("no such function", "unknown function"),
    ("no such collation", "unknown collation"),
    ("ambiguous column", "ambiguous column name; qualify it with its table"),
    ("wrong number of arguments", "wrong number of arguments to a function"),
    ("misuse of", "an aggregate or window function used where it is not allowed"),
    ("integer overflow", "a number is out of range"),
    ("syntax error", "syntax error"),
    ("near ", "syntax error"),
    ("unrecognized token", "syntax error"),
    ("incomplete input", "syntax error"),
    ("too many", "query is too complex"),
    ("tree is too large", "query is too complex"),
    ("parser stack overflow", "query is too complex"),
    ("circular reference", "invalid recursive query"),
    ("recursive", "invalid recursive query"),
)


def _sqlite_error(exc: sqlite3.Error, budget_ms: int) -> ToolError:
    name = getattr(exc, "sqlite_errorname", None) or ""
    message = str(exc)
    log.warning(
        "sql_query_failed",
        backend="sqlite",
        error_code=name,
        error_type=type(exc).__name__,
        error=message,
    )
    lowered = message.lower()
    if isinstance(exc, sqlite3.ProgrammingError) and "one statement" in lowered:
        return ToolRefused("exactly one statement is allowed", category="sql_multi_statement")
    if name == "SQLITE_INTERRUPT" or "interrupted" in lowered:
        return ToolError(f"query stopped: it ran past the {budget_ms} ms time limit")
    if name == "SQLITE_AUTH" or "not authorized" in lowered or "prohibited" in lowered:
        return ToolRefused("permission denied", category="sql_permission")
    if name.startswith("SQLITE_READONLY") or "readonly" in lowered or "read-only" in lowered:
        return ToolRefused("read-only: writing is not allowed", category="sql_write")
    if name in ("SQLITE_TOOBIG", "SQLITE_NOMEM", "SQLITE_FULL") or "too big" in lowered:
        return _too_big(name or "SQLITE_TOOBIG")
    if name.startswith(
        ("SQLITE_CANTOPEN", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_CORRUPT",
         "SQLITE_NOTADB", "SQLITE_PERM")
    ):  # fmt: skip
        return ToolError("database unavailable")
    for needle, safe in _SQLITE_MESSAGES:
        if needle in lowered:
            return ToolError(f"query failed: {safe}")
    return ToolError("query failed")


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """asyncpg's reset plus what it leaves out of DISCARD ALL (its prepared statements
    stay: they are the driver's cache, not session state a query can set)."""
    await conn.reset()
    await conn.execute("RESET ROLE; DISCARD TEMP; DISCARD SEQUENCES")


def _sqlite_authorizer(policy: SqlPolicy, other_tables: frozenset[str]) -> Any:
    """Allow SELECT, reads of the sample tables (and of CTEs), and allowed functions."""
    allowed_tables = policy.tables
    allowed_functions = policy.functions

    def authorize(
        action: int, arg1: str | None, arg2: str | None, dbname: str | None, source: str | None
    ) -> int:
        if action == sqlite3.SQLITE_SELECT:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            # dbname is "main" for a column of a table, None for `count(*)` on a table
            # and for a CTE's own rows (then arg1 is the CTE's name).
            table = arg1 or ""
            if dbname == "main":
                ok = table in allowed_tables
            else:
                ok = dbname is None and (
                    table in allowed_tables
                    or (
                        table.lower() not in other_tables
                        and not table.lower().startswith("sqlite_")
                    )
                )
            return sqlite3.SQLITE_OK if ok else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION:
            ok = (arg2 or "").lower() in allowed_functions
            return sqlite3.SQLITE_OK if ok else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_RECURSIVE:
            return sqlite3.SQLITE_OK  # bounded by the progress handler's deadline
        return sqlite3.SQLITE_DENY

    return authorize
