"""Driver errors of the SQL tool as fixed messages, one per kind of failure.

The driver's own messages can name the server, port, database, roles, settings and
catalog internals; the caller gets a fixed message per kind (and the SQLSTATE, which
names only the kind), and the detail goes to the log.
"""

from __future__ import annotations

import sqlite3

import asyncpg
import structlog

from orchestrator.tools.base import ToolError, ToolRefused

log = structlog.get_logger("orchestrator.tools.sql")

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


def too_big(sqlstate: str) -> ToolError:
    return ToolError(
        "query stopped: it needed more memory, disk or complexity than allowed "
        f"(SQLSTATE {sqlstate}); select fewer rows or shorter values"
    )


def postgres_error(exc: BaseException, budget_ms: int) -> ToolError:
    sqlstate = getattr(exc, "sqlstate", None) if isinstance(exc, asyncpg.PostgresError) else None
    log.warning(
        "sql query failed",
        **{
            "event.action": "sql.query",
            "event.outcome": "failure",
            "labels.backend": "postgres",
            "error.code": sqlstate,
            "error.type": type(exc).__name__,
            "error.message": str(exc),
            "labels.error_detail": getattr(exc, "detail", None),
            "labels.error_hint": getattr(exc, "hint", None),
        },
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
        return too_big(sqlstate)
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


def sqlite_error(exc: sqlite3.Error, budget_ms: int) -> ToolError:
    name = getattr(exc, "sqlite_errorname", None) or ""
    message = str(exc)
    log.warning(
        "sql query failed",
        **{
            "event.action": "sql.query",
            "event.outcome": "failure",
            "labels.backend": "sqlite",
            "error.code": name or None,
            "error.type": type(exc).__name__,
            "error.message": message,
        },
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
        return too_big(name or "SQLITE_TOOBIG")
    if name.startswith(
        ("SQLITE_CANTOPEN", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_CORRUPT",
         "SQLITE_NOTADB", "SQLITE_PERM")
    ):  # fmt: skip
        return ToolError("database unavailable")
    for needle, safe in _SQLITE_MESSAGES:
        if needle in lowered:
            return ToolError(f"query failed: {safe}")
    return ToolError("query failed")
