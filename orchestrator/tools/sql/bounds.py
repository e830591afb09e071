"""Upper bounds on what one query can make the database build, computed before it runs.

PostgreSQL bounds sorts and hashes by `work_mem` and temporary files by
`temp_file_limit`, but not a single value: `format('%900000000s', '')`, a `bpchar(n)`
cast, nested `replace`, `string_agg` over a cross join, or `x || x` through a chain of
subqueries each allocate as much as they are asked to (up to 1 GB a value), and SQLite
likewise up to its length limit. The check below walks the parsed query once and gives
every expression an upper bound on the size of its value (bytes of text) and every
relation an upper bound on its rows, from the sizes of the sample tables, constant
arguments and the rules of each allowed function. A query whose bounds pass the limits
cannot build a value over `max_value_bytes`, nor hold more than about
`max_query_bytes` at once, whatever its data; one that does not pass is refused before
it reaches the database.

The bounds are conservative: a name that cannot be resolved takes the widest value in
scope, joins multiply unless an equality on a unique column proves otherwise, and a
recursive query has unbounded rows. Functions without a rule here cannot be allowed
(`check_coverage` fails on import).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from pglast import ast
from pglast.enums import nodes as node_enums
from pglast.enums import parsenodes, primnodes

from orchestrator.tools.base import ToolRefused

INF = math.inf
# The text of a PostgreSQL numeric: 131072 digits before the point, 16383 after.
NUMERIC_MAX = 147_500
# Room for a date, time, interval or float as text.
SMALL = 96
DEFAULT_TABLE_ROWS = 1000
DEFAULT_COLUMN_BYTES = 256


@dataclass(frozen=True)
class Limits:
    max_value_bytes: int = 1_000_000  # one value (a cell, an aggregate's state)
    max_query_bytes: int = 64_000_000  # every value, hash and sort of one query at once
    max_result_bytes: int = 32_000_000  # the rows the tool fetches
    max_series_rows: int = 1_000_000  # one generate_series
    max_format_width: int = 1000  # a width or precision in format()/printf()
    max_selects: int = 64  # SELECTs in one query, CTEs and subqueries included
    max_steps: int = 100_000  # tree nodes the analysis may visit
    # Byte comparisons one call of a searching function may make (instr, replace,
    # translate, LIKE on SQLite ...): neither engine can stop a call half-way.
    max_scan_bytes: int = 100_000_000
    # Digit pairs of numeric multiplication, division, roots and logarithms in one query
    # (about 1e10 a second): PostgreSQL does not stop an expression half-way, so a chain
    # of divisions of 100 000-digit numbers could run far past statement_timeout.
    max_numeric_work: float = 3e10
    recursion_rounds: int = 12
    work_mem_bytes: int = 4 * 1024 * 1024  # what one sort or hash may hold in memory
    fetch_rows: int = 201  # rows the tool reads of a result


@dataclass(frozen=True)
class DataShape:
    """What the sample tables hold: widest value of each column as text, row counts,
    and the single columns with a unique index (joins on them do not multiply rows)."""

    columns: Mapping[str, Mapping[str, int]]  # table -> column -> bytes
    rows: Mapping[str, int]
    unique: Mapping[str, frozenset[str]] = field(default_factory=dict)


def default_shape(tables: Iterable[str], columns: Iterable[str]) -> DataShape:
    """A shape when only the names are known: every table has every column."""
    cols = {c: DEFAULT_COLUMN_BYTES for c in columns}
    return DataShape(
        columns={t: cols for t in tables}, rows={t: DEFAULT_TABLE_ROWS for t in tables}
    )


def _too_large(what: str, size: float, limit: int) -> ToolRefused:
    shown = "without bound" if size == INF else f"up to about {int(size):,} bytes"
    return ToolRefused(
        f"query refused: {what} could build {shown} (the limit is {limit:,}); "
        "select fewer rows or shorter values, or add LIMIT",
        category="sql_too_large",
    )


# ------------------------------------------------------------------- relations


@dataclass
class _Rel:
    cols: list[tuple[str | None, float]]
    rows: float
    table: str | None = None  # a base table (for unique columns)

    def col(self, name: str) -> float | None:
        hits = [b for n, b in self.cols if n == name]
        return max(hits) if hits else None

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.cols)

    def widest(self) -> float:
        return max((b for _, b in self.cols), default=0.0)

    def row_bytes(self) -> float:
        return sum(b for _, b in self.cols) + 4 * len(self.cols) + 8

    def renamed(self, names: Sequence[str]) -> _Rel:
        cols = [(names[i] if i < len(names) else n, b) for i, (n, b) in enumerate(self.cols)]
        return _Rel(cols, self.rows, self.table)


@dataclass
class _Env:
    parent: _Env | None
    rels: dict[str, _Rel] = field(default_factory=dict)
    ctes: dict[str, _Rel] = field(default_factory=dict)
    outputs: list[tuple[str | None, float]] = field(default_factory=list)
    in_rows: float = 1.0
    in_row_bytes: float = 0.0
    srf_rows: float = 1.0
    aggregated: bool = False

    def chain(self) -> Iterable[_Env]:
        env: _Env | None = self
        while env is not None:
            yield env
            env = env.parent

    def cte(self, name: str) -> _Rel | None:
        for env in self.chain():
            if name in env.ctes:
                return env.ctes[name]
        return None


@dataclass
class _Factor:
    alias: str | None
    rel: _Rel
    keyable: bool  # may be counted once per row of the others when keyed
    join: tuple[Any, _Factor, _Factor, list[Any]] | None = None


# ------------------------------------------------------------------- constants


class _NotConst:
    pass


_NOT_CONST = _NotConst()


def _const(node: Any) -> Any:
    """The value of a constant (also under a cast), or _NOT_CONST."""
    if isinstance(node, ast.TypeCast):
        return _const(node.arg)
    if isinstance(node, ast.A_Const):
        if node.isnull:
            return None
        val = node.val
        if isinstance(val, ast.Integer):
            return val.ival
        if isinstance(val, ast.Float):
            return Decimal(val.fval or "0")
        if isinstance(val, ast.String):
            return val.sval
        if isinstance(val, ast.Boolean):
            return val.boolval
        if isinstance(val, ast.BitString):
            return val.bsval
    return _NOT_CONST


def _const_bytes(node: Any) -> float:
    if node.isnull:
        return 4
    val = node.val
    if isinstance(val, ast.String):
        return len((val.sval or "").encode())
    if isinstance(val, ast.Integer):
        return len(str(val.ival))
    if isinstance(val, ast.Float):
        return len(val.fval or "") + 2
    if isinstance(val, ast.BitString):
        return 4 * len(val.bsval or "") + 2  # x'ff' is 8 bits as text
    return 8


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | Decimal):
        return Decimal(value)
    if isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            return None
        return number if number.is_finite() else None
    return None


_INTERVAL_UNITS = {
    # the shortest each unit can be, in seconds (a month is at least 28 days)
    "microsecond": 1e-6, "microseconds": 1e-6, "us": 1e-6, "usec": 1e-6, "usecs": 1e-6,
    "millisecond": 1e-3, "milliseconds": 1e-3, "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
    "second": 1, "seconds": 1, "sec": 1, "secs": 1, "s": 1,
    "minute": 60, "minutes": 60, "min": 60, "mins": 60, "m": 60,
    "hour": 3600, "hours": 3600, "hr": 3600, "hrs": 3600, "h": 3600,
    "day": 86400, "days": 86400, "d": 86400,
    "week": 7 * 86400, "weeks": 7 * 86400, "w": 7 * 86400,
    "month": 28 * 86400, "months": 28 * 86400, "mon": 28 * 86400, "mons": 28 * 86400,
    "year": 365 * 86400, "years": 365 * 86400, "y": 365 * 86400, "yr": 365 * 86400,
    "yrs": 365 * 86400,
}  # fmt: skip
_INTERVAL_PART = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)\s*([a-z]+)\s*")
_CLOCK = re.compile(r"\s*(\d+):(\d{1,2})(?::(\d{1,2}(?:\.\d+)?))?\s*")


def _interval_seconds(text: str) -> float | None:
    """The shortest an interval literal can be, in seconds; None if not understood."""
    text = text.strip().lower()
    total = 0.0
    clock = _CLOCK.fullmatch(text)
    if clock:
        h, m, s = clock.groups()
        return int(h) * 3600 + int(m) * 60 + float(s or 0)
    pos = 0
    while pos < len(text):
        part = _INTERVAL_PART.match(text, pos)
        if not part or part.group(2) not in _INTERVAL_UNITS:
            return None
        amount = float(part.group(1))
        if amount < 0:
            return None  # a negative or mixed-sign step: not bounded here
        total += amount * _INTERVAL_UNITS[part.group(2)]
        pos = part.end()
    return total if pos else None


def _timestamp(text: str) -> dt.datetime | None:
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return value.replace(tzinfo=None) if value.tzinfo is None else value


# ------------------------------------------------------------------- functions

# Aggregates (plain, ordered-set and window use): their input rows matter.
COLLECTING = frozenset(
    {"string_agg", "array_agg", "json_agg", "jsonb_agg", "json_object_agg",
     "jsonb_object_agg", "group_concat"}
)  # fmt: skip
AGGREGATES = COLLECTING | frozenset(
    {"count", "sum", "total", "avg", "min", "max", "stddev", "stddev_pop", "stddev_samp",
     "variance", "var_pop", "var_samp", "bool_and", "bool_or", "every", "percentile_cont",
     "percentile_disc", "mode", "corr", "covar_pop", "covar_samp", "regr_slope",
     "regr_intercept"}
)  # fmt: skip
SET_RETURNING = frozenset({"generate_series", "unnest", "regexp_matches"})
# Functions whose one call may compare every byte of one argument with every byte of
# another (a naive substring search, a per-character lookup).
SEARCHING = frozenset(
    {"instr", "replace", "strpos", "position", "split_part", "string_to_array", "translate",
     "like", "glob"}
)  # fmt: skip

_FIXED = frozenset(
    {"count", "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile",
     "corr", "covar_pop", "covar_samp", "regr_slope", "regr_intercept", "bool_and",
     "bool_or", "every", "length", "char_length", "character_length", "octet_length",
     "position", "strpos", "starts_with", "ascii", "chr", "sign", "pi", "degrees",
     "radians", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "width_bucket",
     "scale", "now", "date_part", "extract", "date_trunc", "age", "make_date",
     "make_time", "make_timestamp", "make_interval", "justify_days", "justify_hours",
     "justify_interval", "timezone", "overlaps", "isfinite", "date_bin", "array_length",
     "cardinality", "array_position", "num_nulls", "num_nonnulls", "to_date",
     "to_timestamp", "percentile_cont", "total", "log2", "instr", "unicode", "like",
     "glob", "typeof", "date", "time", "datetime", "julianday", "unixepoch"}
)  # fmt: skip
# At most the first argument (give or take case mapping and trimming).
_NOT_LONGER = frozenset(
    {"min", "max", "first_value", "last_value", "nth_value", "substr", "substring",
     "trim", "btrim", "ltrim", "rtrim", "left", "right", "split_part", "reverse", "mode",
     "percentile_disc"}
)  # fmt: skip
# Numbers whose digits grow at most by the digits of their arguments.
_NUMERIC = frozenset(
    {"sum", "avg", "abs", "ceil", "ceiling", "floor", "mod", "div", "gcd", "lcm", "sqrt",
     "cbrt", "ln", "log", "log10", "stddev", "stddev_pop", "stddev_samp", "variance",
     "var_pop", "var_samp", "round", "trunc", "to_number"}
)  # fmt: skip
_OTHER_RULES = frozenset(
    {"string_agg", "array_agg", "json_agg", "jsonb_agg", "json_object_agg",
     "jsonb_object_agg", "group_concat", "lag", "lead", "lower", "upper", "initcap",
     "translate", "regexp_match", "regexp_matches", "concat", "concat_ws", "to_json",
     "to_jsonb", "row_to_json", "json_build_object", "jsonb_build_object",
     "json_build_array", "jsonb_build_array", "overlay", "array_to_string",
     "string_to_array", "regexp_split_to_array", "like_escape", "similar_to_escape",
     "current_setting", "unnest", "generate_series", "to_char", "format", "printf",
     "replace", "regexp_replace", "exp", "power", "pow", "char", "strftime", "ifnull",
     "iif", "coalesce", "nullif"}
)  # fmt: skip
SIZED_FUNCTIONS = _FIXED | _NOT_LONGER | _NUMERIC | _OTHER_RULES


def check_coverage(functions: Iterable[str]) -> None:
    """Every allowed function needs a size rule here."""
    missing = sorted(set(functions) - SIZED_FUNCTIONS)
    if missing:
        raise RuntimeError(f"allowed SQL functions without a size rule: {missing}")


_PG_FORMAT_SPEC = re.compile(r"%(?:(\d+)\$)?(-)?(\*(?:\d+\$)?|\d+)?([sIL%])")
_C_FORMAT_SPEC = re.compile(r"%([-+ 0#,!]*)(\*|\d+)?(?:\.(\*|\d+))?(ll|l|h|hh|j|z|t|L)?([a-zA-Z%])")


# -------------------------------------------------------------------- analysis


class _Analysis:
    def __init__(self, shape: DataShape, limits: Limits, dialect: str, base_max: float) -> None:
        self.shape = shape
        self.limits = limits
        self.dialect = dialect
        self.base_max = base_max
        self.total = 0.0
        self.selects = 0
        self.steps = 0
        self.numeric_work = 0.0

    # ---- bookkeeping

    def _step(self) -> None:
        self.steps += 1
        if self.steps > self.limits.max_steps:
            raise ToolRefused("query is too complex to check", category="sql_too_complex")

    def _value(self, what: str, size: float) -> float:
        if math.isnan(size):
            size = INF
        if size > self.limits.max_value_bytes:
            raise _too_large(what, size, self.limits.max_value_bytes)
        self.total += size
        if self.total > self.limits.max_query_bytes:
            raise _too_large("the query as a whole", self.total, self.limits.max_query_bytes)
        return size

    def _memory(self, what: str, rows: float, row_bytes: float, *, spills: bool) -> None:
        """A sort or hash over `rows` rows: up to work_mem when it can spill to disk."""
        size = rows * row_bytes
        if math.isnan(size):
            size = INF
        if spills:
            size = min(size, self.limits.work_mem_bytes)
        if size > self.limits.max_query_bytes:
            raise _too_large(what, size, self.limits.max_query_bytes)
        self.total += size
        if self.total > self.limits.max_query_bytes:
            raise _too_large("the query as a whole", self.total, self.limits.max_query_bytes)

    # ---- statements

    def top(self, stmt: Any) -> _Rel:
        rel = self.select(stmt, _Env(None))
        fetched = min(rel.rows, self.limits.fetch_rows) * rel.row_bytes()
        if fetched > self.limits.max_result_bytes:
            raise _too_large("the result", fetched, self.limits.max_result_bytes)
        # PostgreSQL turns each result row into JSON text (escaping can grow it 6x).
        self._memory("a result row as JSON", 1, 6 * rel.row_bytes(), spills=False)
        return rel

    def select(self, node: Any, outer: _Env) -> _Rel:
        self._step()
        self.selects += 1
        if self.selects > self.limits.max_selects:
            raise ToolRefused(
                f"query has more than {self.limits.max_selects} SELECTs",
                category="sql_too_complex",
            )
        env = _Env(outer)
        if node.withClause is not None:
            self._with(node.withClause, env)
        if node.op != parsenodes.SetOperation.SETOP_NONE:
            return self._set_operation(node, env)
        if node.valuesLists:
            rows_list = [list(row or ()) for row in node.valuesLists]
            width = max(len(row) for row in rows_list)
            cols: list[tuple[str | None, float]] = []
            for i in range(width):
                bound = max(
                    (self.expr(row[i], env) for row in rows_list if i < len(row)), default=0
                )
                cols.append((f"column{i + 1}", bound))
            env.outputs = cols
            self._tail(node, env)
            return _Rel(cols, self._limited(node, len(rows_list)))

        factors = [self._from_item(item, env) for item in node.fromClause or ()]
        conjuncts = _conjuncts(node.whereClause)
        flat: list[_Factor] = []
        for factor in factors:
            flat.extend(self._flatten(factor, conjuncts))
        env.in_rows = self._join_rows(flat, conjuncts, env)
        env.in_row_bytes = sum(f.rel.row_bytes() for f in flat)
        if node.whereClause is not None:
            self.expr(node.whereClause, env)

        outputs: list[tuple[str | None, float]] = []
        for target in node.targetList or ():
            val: Any = target.val
            if isinstance(val, ast.ColumnRef) and isinstance(
                (val.fields or (None,))[-1], ast.A_Star
            ):
                outputs.extend(self._star(val, env))
                continue
            bound = self.expr(val, env)
            outputs.append((target.name or _figure_name(val), bound))
        env.outputs = outputs

        sets = 1.0
        for item in node.groupClause or ():
            sets *= _grouping_sets(item)
            self.expr(item, env)
        if node.groupClause or env.aggregated:
            self._memory("GROUP BY", env.in_rows, env.in_row_bytes, spills=True)
        if node.havingClause is not None:
            self.expr(node.havingClause, env)
        for window in node.windowClause or ():
            self.expr(window, env)
        if node.distinctClause:
            for item in node.distinctClause:
                if item is not None:
                    self.expr(item, env)
            self._memory("DISTINCT", env.in_rows, env.in_row_bytes, spills=True)
        self._tail(node, env)

        if node.groupClause:
            rows = env.in_rows * sets
        elif env.aggregated:
            rows = 1.0
        else:
            rows = env.in_rows
        rows *= env.srf_rows
        return _Rel(outputs, self._limited(node, rows))

    def _tail(self, node: Any, env: _Env) -> None:
        if node.sortClause:
            for item in node.sortClause:
                self.expr(item, env)
            self._memory("ORDER BY", env.in_rows, env.in_row_bytes, spills=True)
        for item in (node.limitCount, node.limitOffset):
            if item is not None:
                self.expr(item, env)

    def _limited(self, node: Any, rows: float) -> float:
        if node.limitOption == node_enums.LimitOption.LIMIT_OPTION_WITH_TIES:
            return rows
        count = _const(node.limitCount) if node.limitCount is not None else _NOT_CONST
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            return min(rows, count)
        return rows

    def _set_operation(self, node: Any, env: _Env) -> _Rel:
        left = self.select(node.larg, env)
        right = self.select(node.rarg, env)
        cols = [
            (name, max(bound, right.cols[i][1] if i < len(right.cols) else 0))
            for i, (name, bound) in enumerate(left.cols)
        ]
        rows = left.rows + right.rows
        row_bytes = max(left.row_bytes(), right.row_bytes())
        if node.op != parsenodes.SetOperation.SETOP_UNION:
            # INTERSECT and EXCEPT may hash every row in memory, without spilling.
            self._memory(f"{node.op.name[6:]}", rows, row_bytes, spills=False)
        elif not node.all:
            self._memory("UNION", rows, row_bytes, spills=True)
        env.outputs = cols
        env.in_rows, env.in_row_bytes = rows, row_bytes
        self._tail(node, env)
        return _Rel(cols, self._limited(node, rows))

    def _with(self, clause: Any, env: _Env) -> None:
        ctes = list(clause.ctes or ())
        if not clause.recursive:
            for cte in ctes:
                rel = self.select(cte.ctequery, env)
                env.ctes[cte.ctename] = rel.renamed(_string_list(cte.aliascolnames))
            return
        names = {cte.ctename for cte in ctes}
        for cte in ctes:
            if cte.search_clause is not None or cte.cycle_clause is not None:
                raise ToolRefused(
                    "SEARCH and CYCLE clauses are not supported; bound the recursion "
                    "with a depth column and a WHERE condition",
                    category="sql_construct",
                )
            query = cte.ctequery
            if (
                isinstance(query, ast.SelectStmt)
                and query.op == parsenodes.SetOperation.SETOP_UNION
                and not query.all
                and _mentions(query, names)
            ):
                raise ToolRefused(
                    "a recursive query must use UNION ALL (UNION keeps every row in memory)",
                    category="sql_construct",
                )
            env.ctes[cte.ctename] = _Rel([(n, 1.0) for n in _string_list(cte.aliascolnames)], 1.0)
        recursive = {cte.ctename for cte in ctes if _mentions(cte.ctequery, names)}
        start_total, start_selects = self.total, self.selects
        for round_ in range(self.limits.recursion_rounds):
            self.total, self.selects = start_total, start_selects
            changed = False
            for cte in ctes:
                rel = self.select(cte.ctequery, env).renamed(_string_list(cte.aliascolnames))
                if cte.ctename in recursive:
                    rel.rows = INF
                old = env.ctes[cte.ctename]
                merged = _merge(old, rel)
                if round_ >= 2:  # numbers stop at NUMERIC_MAX: jump there, then settle
                    merged = _widen(old, merged)
                if merged.cols != old.cols or merged.rows != old.rows:
                    changed = True
                env.ctes[cte.ctename] = merged
            if not changed:
                return
        raise ToolRefused(
            "query refused: a recursive query whose values grow with every round (such as "
            "s || 'x') could build values without bound",
            category="sql_too_large",
        )

    # ---- FROM

    def _from_item(self, item: Any, env: _Env) -> _Factor:
        self._step()
        if isinstance(item, ast.RangeVar):
            relname = item.relname or ""
            alias = (item.alias.aliasname if item.alias else None) or relname
            cte = env.cte(relname) if item.schemaname is None else None
            if cte is not None:
                rel = _Rel(list(cte.cols), cte.rows)
            else:
                columns = self.shape.columns.get(relname, {})
                rel = _Rel(
                    [(c, float(b)) for c, b in columns.items()],
                    float(self.shape.rows.get(relname, DEFAULT_TABLE_ROWS)),
                    table=relname,
                )
            if item.alias is not None:
                rel = rel.renamed(_string_list(item.alias.colnames))
            env.rels[alias] = rel
            return _Factor(alias, rel, keyable=cte is None)
        if isinstance(item, ast.RangeSubselect):
            rel = self.select(item.subquery, env)
            sub_alias = item.alias.aliasname if item.alias else None
            if item.alias is not None:
                rel = rel.renamed(_string_list(item.alias.colnames))
            if sub_alias:
                env.rels[sub_alias] = rel
            return _Factor(sub_alias, rel, keyable=False)
        if isinstance(item, ast.RangeFunction):
            rows = 0.0
            cols: list[tuple[str | None, float]] = []
            for pair in item.functions or ():
                call = pair[0]
                value, call_rows = self._call(call, env, in_from=True)
                self._value(f"{_function_name(call)}()", value)
                rows = max(rows, call_rows)
                cols.append((_figure_name(call), value))
            if item.ordinality:
                cols.append(("ordinality", 24.0))
            rel = _Rel(cols, rows)
            fn_alias: str | None = None
            if item.alias is not None:
                fn_alias = item.alias.aliasname
                rel = rel.renamed(_string_list(item.alias.colnames))
            elif len(cols) == 1 or (item.ordinality and len(cols) == 2):
                fn_alias = cols[0][0]
            if fn_alias:
                env.rels[fn_alias] = rel
            return _Factor(fn_alias, rel, keyable=False)
        if isinstance(item, ast.JoinExpr):
            left = self._from_item(item.larg, env)
            right = self._from_item(item.rarg, env)
            if item.quals is not None:
                self.expr(item.quals, env)
            rel = _Rel(left.rel.cols + right.rel.cols, 0.0)
            factor = _Factor(
                None, rel, keyable=False, join=(item.jointype, left, right, _conjuncts(item.quals))
            )
            if item.alias is not None:
                env.rels[item.alias.aliasname or ""] = rel.renamed(
                    _string_list(item.alias.colnames)
                )
            return factor
        raise ToolRefused(f"{type(item).__name__} is not allowed in FROM", category="sql_construct")

    def _flatten(self, factor: _Factor, conjuncts: list[Any]) -> list[_Factor]:
        """Inner, cross and left joins as a list of factors (their ON conditions join
        the WHERE conjuncts); a full join is one factor of (l + 1) * (r + 1) rows."""
        join = factor.join
        if join is None:
            return [factor]
        jointype, left, right, quals = join
        if jointype == node_enums.JoinType.JOIN_RIGHT:
            left, right = right, left
            jointype = node_enums.JoinType.JOIN_LEFT
        if jointype in (node_enums.JoinType.JOIN_INNER, node_enums.JoinType.JOIN_LEFT):
            conjuncts.extend(quals)
            return self._flatten(left, conjuncts) + self._flatten(right, conjuncts)
        inner = self._flatten(left, []) + self._flatten(right, [])
        rows = math.prod(max(1.0, f.rel.rows) + 1 for f in inner)
        return [_Factor(None, _Rel(factor.rel.cols, rows), keyable=False)]

    def _join_rows(self, factors: list[_Factor], conjuncts: list[Any], env: _Env) -> float:
        """Rows of a join: the product of the factors' rows, except that a factor joined
        by equality on one of its unique columns to counted factors (or constants)
        adds at most one row per row of the others."""
        if not factors:
            return 1.0
        pending = list(factors)
        counted: list[_Factor] = []
        rows = 1.0
        while pending:
            keyed = next((f for f in pending if self._keyed(f, counted, factors, conjuncts)), None)
            if keyed is None:
                # Count first a factor that no equality could key, then the largest.
                free = [f for f in pending if not self._keyable_at_all(f, factors, conjuncts)]
                keyed = max(free or pending, key=lambda f: f.rel.rows)
                rows *= max(1.0, keyed.rel.rows)
                if len(counted) >= 1:
                    self._memory("a join", keyed.rel.rows, keyed.rel.row_bytes(), spills=True)
            pending.remove(keyed)
            counted.append(keyed)
        return rows

    def _unique_cols(self, factor: _Factor) -> frozenset[str]:
        if not factor.keyable or factor.rel.table is None:
            return frozenset()
        return self.shape.unique.get(factor.rel.table, frozenset())

    def _refers(self, ref: Any, factor: _Factor, factors: list[_Factor]) -> str | None:
        """The column of `factor` that `ref` names for sure, if any."""
        if not isinstance(ref, ast.ColumnRef):
            return None
        names = _string_list(ref.fields)
        if len(names) != len(ref.fields or ()):
            return None
        if len(names) >= 2 and names[-2] == factor.alias:
            return names[-1]
        if len(names) == 1 and factor.rel.has(names[0]):
            if sum(1 for f in factors if f.rel.has(names[0])) == 1:
                return names[0]
        return None

    def _independent(
        self, expr: Any, factor: _Factor, counted: list[_Factor], factors: list[_Factor]
    ) -> bool:
        """`expr` is fixed once the counted factors' rows are (a constant, an outer
        reference or a column of a counted factor)."""
        if isinstance(expr, ast.TypeCast):
            return self._independent(expr.arg, factor, counted, factors)
        if isinstance(expr, ast.A_Const):
            return True
        if not isinstance(expr, ast.ColumnRef):
            return False
        names = _string_list(expr.fields)
        if len(names) != len(expr.fields or ()):
            return False
        aliases = {f.alias for f in factors}
        if len(names) >= 2:
            if names[-2] not in aliases:
                return True  # an outer query's row: fixed here
            return any(f.alias == names[-2] for f in counted) and names[-2] != factor.alias
        owners = [f for f in factors if f.rel.has(names[0])]
        return bool(owners) and all(f in counted and f is not factor for f in owners)

    def _keyed(
        self, factor: _Factor, counted: list[_Factor], factors: list[_Factor], conjuncts: list[Any]
    ) -> bool:
        unique = self._unique_cols(factor)
        if not unique:
            return False
        for conj in conjuncts:
            pair = _equality(conj)
            if pair is None:
                continue
            for side, other in (pair, pair[::-1]):
                col = self._refers(side, factor, factors)
                if col in unique and self._independent(other, factor, counted, factors):
                    return True
        return False

    def _keyable_at_all(
        self, factor: _Factor, factors: list[_Factor], conjuncts: list[Any]
    ) -> bool:
        unique = self._unique_cols(factor)
        return bool(unique) and any(
            self._refers(side, factor, factors) in unique
            for conj in conjuncts
            if (pair := _equality(conj)) is not None
            for side in pair
        )

    # ---- names

    def _star(self, ref: Any, env: _Env) -> list[tuple[str | None, float]]:
        names = _string_list(ref.fields[:-1])
        if names:
            for level in env.chain():
                if names[-1] in level.rels:
                    return list(level.rels[names[-1]].cols)
            return [(None, self._fallback(env))]
        cols: list[tuple[str | None, float]] = []
        for rel in _distinct(env.rels.values()):
            cols.extend(rel.cols)
        return cols

    def _fallback(self, env: _Env) -> float:
        """The widest value any name in scope could stand for."""
        widest = self.base_max
        for level in env.chain():
            for rel in level.rels.values():
                widest = max(widest, rel.row_bytes())
            for cte in level.ctes.values():
                widest = max(widest, cte.row_bytes())
            widest = max([widest, *(b for _, b in level.outputs)])
        return widest

    def _column(self, ref: Any, env: _Env) -> float:
        fields = ref.fields
        if isinstance(fields[-1], ast.A_Star):  # t.* as a value: the whole row
            names = _string_list(fields[:-1])
            for level in env.chain():
                if names and names[-1] in level.rels:
                    return level.rels[names[-1]].row_bytes()
            return self._fallback(env)
        names = _string_list(fields)
        if len(names) != len(fields):
            return self._fallback(env)
        if len(names) == 1:
            name = names[0]
            for level in env.chain():
                hits = [
                    b for rel in _distinct(level.rels.values()) if (b := rel.col(name)) is not None
                ]
                if hits:
                    return max(hits)
                if level is env:
                    named = [b for n, b in level.outputs if n == name]
                    if named:
                        return max(named)
                if name in level.rels:  # a whole-row reference
                    return level.rels[name].row_bytes()
            return self._fallback(env)
        rel_name, col = names[-2], names[-1]
        for level in env.chain():
            if rel_name in level.rels:
                rel = level.rels[rel_name]
                bound = rel.col(col)
                return bound if bound is not None else rel.row_bytes()
        return self._fallback(env)

    # ---- expressions

    def expr(self, node: Any, env: _Env) -> float:
        if node is None:
            return 0.0
        if isinstance(node, list | tuple):
            return sum(self.expr(n, env) for n in node)
        self._step()
        return self._value(_describe(node), self._expr(node, env))

    def _expr(self, node: Any, env: _Env) -> float:
        if isinstance(node, ast.A_Const):
            return _const_bytes(node)
        if isinstance(node, ast.ColumnRef):
            return self._column(node, env)
        if isinstance(node, ast.FuncCall):
            value, rows = self._call(node, env, in_from=False)
            if rows != 1.0:
                env.srf_rows *= rows
            return value
        if isinstance(node, ast.A_Expr):
            return self._operator(node, env)
        if isinstance(node, ast.TypeCast):
            return self._cast(node, env)
        if isinstance(node, ast.BoolExpr | ast.NullTest | ast.BooleanTest | ast.GroupingFunc):
            for attr in ("args", "arg"):
                if hasattr(node, attr):
                    self.expr(getattr(node, attr), env)
            return 8
        if isinstance(node, ast.CaseExpr):
            self.expr(node.arg, env)
            results = [self.expr(w.result, env) for w in node.args or ()]
            for w in node.args or ():
                self.expr(w.expr, env)
            return max([self.expr(node.defresult, env), *results])
        if isinstance(node, ast.CoalesceExpr | ast.MinMaxExpr):
            return max((self.expr(a, env) for a in node.args or ()), default=4)
        if isinstance(node, ast.A_ArrayExpr | ast.RowExpr):
            elements: list[Any] = list(
                (node.elements if isinstance(node, ast.A_ArrayExpr) else node.args) or ()
            )
            return 2 * sum(self.expr(a, env) for a in elements) + 2 * len(elements) + 8
        if isinstance(node, ast.SubLink):
            return self._sublink(node, env)
        if isinstance(node, ast.A_Indirection):
            for item in node.indirection or ():
                if isinstance(item, ast.A_Indices):
                    self.expr(item.lidx, env)
                    self.expr(item.uidx, env)
            return self.expr(node.arg, env)
        if isinstance(node, ast.CollateClause | ast.NamedArgExpr):
            return self.expr(node.arg, env)
        if isinstance(node, ast.SQLValueFunction):
            return 64
        if isinstance(node, ast.SortBy):
            return self.expr(node.node, env)
        if isinstance(node, ast.WindowDef):
            self.expr(node.partitionClause, env)
            self.expr(node.orderClause, env)
            self.expr(node.startOffset, env)
            self.expr(node.endOffset, env)
            if node.partitionClause or node.orderClause:
                self._memory("a window", env.in_rows, env.in_row_bytes, spills=True)
            return 0
        if isinstance(node, ast.GroupingSet):
            return self.expr(node.content, env)
        if isinstance(node, ast.ResTarget):
            return self.expr(node.val, env)
        raise ToolRefused(
            f"{type(node).__name__} cannot be bounded; it is not allowed", category="sql_construct"
        )

    def _sublink(self, node: Any, env: _Env) -> float:
        self.expr(node.testexpr, env)
        sub = self.select(node.subselect, env)
        kind = node.subLinkType
        if kind == primnodes.SubLinkType.EXPR_SUBLINK:
            return sub.cols[0][1] if sub.cols else 4
        if kind == primnodes.SubLinkType.ARRAY_SUBLINK:
            first = sub.cols[0][1] if sub.cols else 4
            return sub.rows * (2 * first + 4) + 8
        if kind in (primnodes.SubLinkType.ANY_SUBLINK, primnodes.SubLinkType.ALL_SUBLINK):
            # `x IN (SELECT ...)` may hash every row of the subquery, without spilling.
            self._memory("IN (SELECT ...)", sub.rows, sub.row_bytes(), spills=False)
        return 8

    def _numeric(self, what: str, cost: float) -> None:
        self.numeric_work += cost
        if self.numeric_work > self.limits.max_numeric_work:
            raise ToolRefused(
                f"query refused: {what} on numbers this large could take too long (about "
                f"{self.numeric_work:.2g} digit operations; the limit is "
                f"{self.limits.max_numeric_work:.2g}); use smaller numbers",
                category="sql_too_large",
            )

    def _scan(self, what: str, cost: float) -> None:
        if cost > self.limits.max_scan_bytes:
            raise ToolRefused(
                f"query refused: {what} could compare about {int(cost):,} bytes in one call "
                f"(the limit is {self.limits.max_scan_bytes:,}); search shorter values",
                category="sql_too_large",
            )

    def _operator(self, node: Any, env: _Env) -> float:
        left = self.expr(node.lexpr, env)
        right = self.expr(node.rexpr, env)
        kind = node.kind
        if self.dialect == "sqlite" and kind in (
            parsenodes.A_Expr_Kind.AEXPR_LIKE,
            parsenodes.A_Expr_Kind.AEXPR_ILIKE,
        ):
            self._scan("LIKE", left * min(right, 200))  # SQLite cannot stop a LIKE
        if kind == parsenodes.A_Expr_Kind.AEXPR_NULLIF:
            return left
        if kind != parsenodes.A_Expr_Kind.AEXPR_OP:
            return 8
        op = (_string_list(node.name) or [""])[-1]
        if op == "||":
            return left + right
        if op in ("=", "<>", "!=", "<", ">", "<=", ">=", "~", "~*", "!~", "!~*", "~~", "!~~",
                  "~~*", "!~~*", "@>", "<@", "&&", "?", "?|", "?&", "@@", "^@"):  # fmt: skip
            return 8
        if op in ("->", "->>", "#>", "#>>", "#-"):
            return 2 * max(left, right) + 8
        if op == "^":
            return self._power(node.lexpr, node.rexpr)
        if op in ("*", "/", "%"):
            self._numeric(f"operator {op}", left * right)
        # Arithmetic: a number's digits grow by at most the digits of both operands and
        # never past NUMERIC_MAX; anything else (dates, intervals, bits, jsonb minus)
        # is at most its wider operand or small.
        return min(left + right + SMALL, max(left, right, NUMERIC_MAX))

    def _power(self, base: Any, exponent: Any) -> float:
        b, e = _number(_const(base)), _number(_const(exponent))
        if b is None or e is None:
            return NUMERIC_MAX
        digits = abs(float(e)) * math.log10(abs(float(b)) + 1) + SMALL
        return min(digits, NUMERIC_MAX)

    def _cast(self, node: Any, env: _Env) -> float:
        inner = self.expr(node.arg, env)
        names = _string_list(node.typeName.names)
        typ = names[-1] if names else ""
        mods = [_const(m) for m in node.typeName.typmods or ()]
        size = 2 * inner + SMALL
        if typ in ("bpchar", "char", "character") and mods:
            width = mods[0]
            if not isinstance(width, int):
                raise ToolRefused("char(n) needs a constant n", category="sql_construct")
            size = max(size, 4 * width)  # blank-padded to n characters
        elif typ == "numeric" and mods and isinstance(mods[0], int):
            size = max(size, inner + mods[0] + 8)
        if node.typeName.arrayBounds:
            size = 2 * size
        return size

    # ---- calls

    def _call(self, node: Any, env: _Env, *, in_from: bool) -> tuple[float, float]:
        """(bound of one value, rows it returns) for a function call."""
        name = _function_name(node)
        args = list(node.args or ())
        bounds = [self.expr(a, env) for a in args]
        order = [self.expr(s, env) for s in node.agg_order or ()]
        self.expr(node.agg_filter, env)
        if node.over is not None:
            self.expr(node.over, env)
        if name in AGGREGATES and node.over is None:
            env.aggregated = True
        if node.agg_order or node.agg_distinct:
            self._memory(f"{name}() ordering", env.in_rows, sum(bounds) + 8, spills=True)
        a0 = bounds[0] if bounds else 0.0
        a1 = bounds[1] if len(bounds) > 1 else 0.0
        a2 = bounds[2] if len(bounds) > 2 else 0.0
        widest = max(bounds, default=0.0)
        total = sum(bounds)
        n = len(bounds)
        card = env.in_rows
        rows = 1.0
        if name in ("div", "mod", "lcm"):
            self._numeric(f"{name}()", a0 * a1)
        elif name in ("sqrt", "cbrt", "ln", "log", "log10"):
            self._numeric(f"{name}()", widest * widest)
        if name in SEARCHING:
            if name in ("like", "glob"):  # like(pattern, text): SQLite caps the pattern
                self._scan(f"{name}()", a1 * min(a0, 200))
            else:
                self._scan(f"{name}()", a0 * a1)

        if name in SET_RETURNING:
            if name == "generate_series":
                rows = self._series_rows(args)
                numbers = [_number(_const(a)) for a in args]
                if all(v is not None for v in numbers):  # digits of the widest bound
                    value = max(len(str(v)) for v in numbers if v is not None) + 2.0
                else:
                    value = SMALL + widest
            elif name == "unnest":
                rows = max(1.0, widest)
                value = widest
            else:  # regexp_matches
                rows = a0 + 1
                value = a0 * (a1 + 1) + 8
        elif name in COLLECTING:
            if name == "string_agg":
                value = card * (a0 + a1)
            elif name == "group_concat":
                value = card * (a0 + (a1 if n > 1 else 1))
            elif name == "array_agg":
                value = card * (2 * a0 + 4) + 8
            elif name in ("json_object_agg", "jsonb_object_agg"):
                value = card * (6 * (a0 + a1) + 8) + 8
            else:
                value = card * (6 * a0 + 4) + 8
        elif name in ("mode", "percentile_disc", "percentile_cont"):
            each = SMALL if name == "percentile_cont" else max(order, default=SMALL)
            # percentile_*(ARRAY[...]) answers one value per fraction.
            value = each if not args or _is_number(args[0]) else (a0 + 1) * (each + 4)
        elif name in _FIXED:
            value = SMALL
        elif name in _NOT_LONGER:
            value = a0 + 8
        elif name in ("lag", "lead"):
            value = max(a0, a2) + 8
        elif name in _NUMERIC:
            if name in ("round", "trunc") and n > 1:
                value = min(a0 + 2048, max(a0, NUMERIC_MAX))
            elif name in ("variance", "var_pop", "var_samp", "stddev", "stddev_pop",
                          "stddev_samp"):  # fmt: skip
                value = min(2 * a0 + 1024, max(a0, NUMERIC_MAX))
            else:
                value = min(total + SMALL, max(widest, NUMERIC_MAX))
        elif name in ("exp",):
            x = _number(_const(args[0])) if args else None
            value = NUMERIC_MAX if x is None else min(abs(float(x)) * 0.4343 + SMALL, NUMERIC_MAX)
        elif name in ("power", "pow"):
            value = self._power(args[0], args[1]) if len(args) == 2 else NUMERIC_MAX
        elif name in ("lower", "upper", "initcap"):
            value = 3 * a0 + 8
        elif name == "translate":
            value = 4 * a0 + 8
        elif name == "regexp_match":
            value = a0 * (a1 + 1) + 8
        elif name == "concat":
            value = total + 8
        elif name == "concat_ws":
            value = total + n * a0 + 8
        elif name in ("to_json", "to_jsonb"):
            value = 6 * a0 + 16
        elif name == "row_to_json":
            value = 8 * a0 + 16
        elif name in ("json_build_object", "jsonb_build_object", "json_build_array",
                      "jsonb_build_array"):  # fmt: skip
            value = 6 * total + 8 * n + 8
        elif name == "overlay":
            value = a0 + a1 + 8
        elif name == "array_to_string":
            value = a0 * (1 + a1 + a2) + 8
        elif name in ("string_to_array", "regexp_split_to_array"):
            value = 6 * a0 + 8
        elif name in ("like_escape", "similar_to_escape"):
            value = 2 * a0 + a1 + 8
        elif name == "current_setting":
            value = 8192
        elif name == "to_char":
            value = 16 * a1 + a0 + 64
        elif name == "strftime":
            value = 16 * a0 + 64
        elif name == "char":
            value = 4 * n + 8
        elif name in ("ifnull", "iif", "coalesce", "nullif"):
            value = widest
        elif name == "replace":
            value = self._replace(args, a0, a2)
        elif name == "regexp_replace":
            value = self._regexp_replace(args, a0, a2)
        elif name in ("format", "printf"):
            value = self._format(args, widest)
        else:
            raise ToolRefused(f"function {name}() cannot be bounded", category="sql_function")
        return value, rows

    def _series_rows(self, args: list[Any]) -> float:
        values = [_const(a) for a in args]
        limit = self.limits.max_series_rows
        if len(values) not in (2, 3) or any(v is _NOT_CONST for v in values):
            raise ToolRefused(
                "generate_series() needs constant bounds (and step)", category="sql_too_large"
            )
        start, stop = values[0], values[1]
        step = values[2] if len(values) == 3 else 1
        if any(v is None for v in (start, stop, step)):
            return 0.0
        nums = [_number(v) for v in (start, stop, step)]
        if all(v is not None for v in nums) and not all(isinstance(v, str) for v in values[:2]):
            lo, hi, by = nums
            assert lo is not None and hi is not None and by is not None
            if by == 0:
                return 0.0
            rows = max(0.0, math.floor(float((hi - lo) / by)) + 1)
        else:
            first = _timestamp(str(start))
            last = _timestamp(str(stop))
            seconds = _interval_seconds(str(step)) if isinstance(step, str) else None
            if first is None or last is None or not seconds:
                raise ToolRefused(
                    "generate_series() takes constant numbers, or ISO dates or timestamps "
                    "with a constant positive interval step",
                    category="sql_too_large",
                )
            try:
                span = (last - first).total_seconds()
            except TypeError as exc:  # one with a time zone, one without
                raise ToolRefused(
                    "generate_series() bounds must both have a time zone or neither",
                    category="sql_too_large",
                ) from exc
            rows = max(0.0, math.floor(span / seconds) + 1)
        if rows > limit:
            raise ToolRefused(
                f"generate_series() would return {int(rows):,} rows; the limit is {limit:,}",
                category="sql_too_large",
            )
        return float(rows)

    def _replace(self, args: list[Any], a0: float, a2: float) -> float:
        pattern = _const(args[1]) if len(args) > 1 else _NOT_CONST
        growth: float
        if isinstance(pattern, str) and pattern:
            growth = math.ceil(a2 / len(pattern.encode()))
        else:
            growth = a2  # a one-character pattern may match every character
        return a0 * max(1.0, growth) + 8

    def _regexp_replace(self, args: list[Any], a0: float, a2: float) -> float:
        replacement = _const(args[2]) if len(args) > 2 else _NOT_CONST
        each: float
        if isinstance(replacement, str) and "\\" not in replacement:
            each = len(replacement.encode())
        else:
            each = a2 * max(1.0, a0)  # \1 ... \9 and \& repeat what they matched
        # A pattern that matches the empty string matches between every two characters.
        return a0 + (a0 + 1) * each + 8

    def _width(self, text: str | None, what: str) -> int:
        if text is None:
            return 0
        if text.startswith("*"):
            raise ToolRefused(
                f"{what}: widths and precisions taken from arguments (*) are not allowed",
                category="sql_too_large",
            )
        width = int(text)
        if width > self.limits.max_format_width:
            raise ToolRefused(
                f"{what}: width {width} is over the limit of {self.limits.max_format_width}",
                category="sql_too_large",
            )
        return width

    def _format(self, args: list[Any], widest: float) -> float:
        """format() on PostgreSQL (%s %I %L, a width) or printf()/format() on SQLite
        (a width and a precision): a constant format string, with bounded widths."""
        name = "format()" if self.dialect == "postgres" else "printf()"
        fmt = _const(args[0]) if args else _NOT_CONST
        if not isinstance(fmt, str):
            raise ToolRefused(f"{name} needs a constant format string", category="sql_too_large")
        size: float = len(fmt.encode()) + 8
        if self.dialect == "postgres":
            for match in _PG_FORMAT_SPEC.finditer(fmt):
                size += max(self._width(match.group(3), name), 2 * widest + 3)
            return size
        for match in _C_FORMAT_SPEC.finditer(fmt):
            width = self._width(match.group(2), name)
            precision = self._width(match.group(3), name)
            # %c repeats its character `precision` times; numbers print up to ~350
            # digits; %q, %Q and %w double quotes.
            size += max(width, 4 * precision + 4, 2 * widest + 3, 400)
        return size


def _widen(old: _Rel, new: _Rel) -> _Rel:
    """A column still growing after two rounds jumps to NUMERIC_MAX (numbers stop
    there); one that then still grows grows without bound and is refused."""
    cols = []
    for i, (name, bound) in enumerate(new.cols):
        before = old.cols[i][1] if i < len(old.cols) else 0.0
        if bound > before and bound < NUMERIC_MAX:
            bound = float(NUMERIC_MAX)
        cols.append((name, bound))
    return _Rel(cols, new.rows, new.table)


def _merge(old: _Rel, new: _Rel) -> _Rel:
    cols = []
    for i in range(max(len(old.cols), len(new.cols))):
        name = (new.cols[i][0] if i < len(new.cols) else None) or (
            old.cols[i][0] if i < len(old.cols) else None
        )
        if i < len(old.cols) and old.cols[i][0] is not None:
            name = old.cols[i][0]
        bound = max(
            old.cols[i][1] if i < len(old.cols) else 0.0,
            new.cols[i][1] if i < len(new.cols) else 0.0,
        )
        cols.append((name, bound))
    return _Rel(cols, max(old.rows, new.rows), None)


# --------------------------------------------------------------------- helpers


def _string_list(items: Iterable[Any] | None) -> list[str]:
    return [i.sval for i in items or () if isinstance(i, ast.String) and i.sval is not None]


def _distinct(rels: Iterable[_Rel]) -> list[_Rel]:
    seen: list[_Rel] = []
    for rel in rels:
        if not any(rel is s for s in seen):
            seen.append(rel)
    return seen


def _is_number(node: Any) -> bool:
    return _number(_const(node)) is not None


def _conjuncts(node: Any) -> list[Any]:
    if node is None:
        return []
    if isinstance(node, ast.BoolExpr) and node.boolop == primnodes.BoolExprType.AND_EXPR:
        return [c for arg in node.args or () for c in _conjuncts(arg)]
    return [node]


def _equality(node: Any) -> tuple[Any, Any] | None:
    if (
        isinstance(node, ast.A_Expr)
        and node.kind == parsenodes.A_Expr_Kind.AEXPR_OP
        and (_string_list(node.name) or [""])[-1] == "="
        and node.lexpr is not None
        and node.rexpr is not None
    ):
        return node.lexpr, node.rexpr
    return None


def _mentions(node: Any, names: set[str]) -> bool:
    """Whether a relation named in `names` is read anywhere under `node`."""
    if isinstance(node, list | tuple):
        return any(_mentions(n, names) for n in node)
    if not isinstance(node, ast.Node):
        return False
    if isinstance(node, ast.RangeVar) and node.schemaname is None and node.relname in names:
        return True
    return any(_mentions(getattr(node, attr), names) for attr in node)


def _grouping_sets(node: Any) -> float:
    if not isinstance(node, ast.GroupingSet):
        return 1.0
    content = list(node.content or ())
    kind = node.kind
    if kind == parsenodes.GroupingSetKind.GROUPING_SET_CUBE:
        return float(2 ** min(len(content), 60))
    if kind == parsenodes.GroupingSetKind.GROUPING_SET_ROLLUP:
        return float(len(content) + 1)
    if kind == parsenodes.GroupingSetKind.GROUPING_SET_SETS:
        return float(sum(_grouping_sets(c) for c in content) or 1)
    return 1.0


def _function_name(node: Any) -> str:
    names = _string_list(node.funcname)
    return names[-1] if names else ""


def _describe(node: Any) -> str:
    if isinstance(node, ast.FuncCall):
        return f"{_function_name(node)}()"
    if isinstance(node, ast.A_Expr):
        kind = node.kind.name if node.kind is not None else "?"
        return f"operator {'.'.join(_string_list(node.name)) or kind}"
    if isinstance(node, ast.TypeCast):
        names = _string_list(node.typeName.names if node.typeName else ())
        return f"a cast to {'.'.join(names)}"
    if isinstance(node, ast.SubLink):
        return "a subquery"
    return {"ColumnRef": "a column", "A_ArrayExpr": "an ARRAY[...]", "RowExpr": "a ROW(...)"}.get(
        type(node).__name__, type(node).__name__
    )


def _figure_name(node: Any) -> str | None:
    """The column name PostgreSQL gives an unnamed target (FigureColname, roughly)."""
    if isinstance(node, ast.ColumnRef):
        names = _string_list(node.fields)
        return names[-1] if names else None
    if isinstance(node, ast.FuncCall):
        names = _string_list(node.funcname)
        return names[-1] if names else None
    if isinstance(node, ast.TypeCast):
        inner = _figure_name(node.arg)
        if inner is not None:
            return inner
        names = _string_list(node.typeName.names if node.typeName else ())
        return names[-1] if names else None
    if isinstance(node, ast.A_Indirection):
        last = node.indirection[-1] if node.indirection else None
        return last.sval if isinstance(last, ast.String) else _figure_name(node.arg)
    if isinstance(node, ast.SubLink):
        if node.subLinkType == primnodes.SubLinkType.EXPR_SUBLINK:
            targets = getattr(node.subselect, "targetList", None) or ()
            if targets:
                first = targets[0]
                return first.name or _figure_name(first.val)
            return None
        if node.subLinkType == primnodes.SubLinkType.ARRAY_SUBLINK:
            return "array"
        if node.subLinkType == primnodes.SubLinkType.EXISTS_SUBLINK:
            return "exists"
        return None
    if isinstance(node, ast.CaseExpr):
        return "case"
    if isinstance(node, ast.CoalesceExpr):
        return "coalesce"
    if isinstance(node, ast.A_ArrayExpr):
        return "array"
    if isinstance(node, ast.RowExpr):
        return "row"
    if isinstance(node, ast.A_Expr) and node.kind == parsenodes.A_Expr_Kind.AEXPR_NULLIF:
        return "nullif"
    return None


def check_bounds(
    stmt: Any,
    shape: DataShape,
    *,
    dialect: str = "postgres",
    limits: Limits | None = None,
) -> None:
    """Refuse (ToolRefused, category `sql_too_large` or `sql_too_complex`) a query that
    could build a value, or hold data, over the limits."""
    limits = limits or Limits()
    base_max = max(
        (sum(cols.values()) + 4 * len(cols) + 8 for cols in shape.columns.values()),
        default=float(DEFAULT_COLUMN_BYTES),
    )
    _Analysis(shape, limits, dialect, float(base_max)).top(stmt)
