"""The SQL tool's query policy: one plain read-only query over the sample tables.

`check_query` parses the input with PostgreSQL's own parser (pglast), allows only the
node types of a plain query, functions from an allowlist, casts to plain types and
relations of the sample schema (or CTEs in scope), applies the size bounds of `bounds`,
and returns the deparsed text that the backend runs, which must parse back to the tree
that was checked (and, for SQLite, split into the same tokens under SQLite's lexer).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pglast import ast, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from orchestrator.tools.base import ToolError, ToolRefused
from orchestrator.tools.sql.bounds import (
    DataShape,
    Limits,
    check_bounds,
    check_coverage,
    default_shape,
)
from services.toolspecs import SQL_SCHEMA as SCHEMA

MAX_QUERY_CHARS = 8000
MAX_INPUT_CHARS = 2 * MAX_QUERY_CHARS  # refused before it is even stripped
MAX_TREE_DEPTH = 200

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


def plain_name(name: str) -> str:
    """`name` itself if it is a plain lower-case SQL name (safe to write into SQL text)."""
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"not a plain lower-case SQL name: {name!r}")
    return name


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
