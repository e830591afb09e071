"""The SQLite backend's own guard: a read-only, limited connection and an authorizer.

Independent of the query policy: the file is opened read-only (`mode=ro`) with
`query_only`, `trusted_schema=OFF`, temporary data on disk and engine limits on value
length, SQL length, attached databases, expression depth, compound selects, LIKE
patterns, parameters, function arguments, columns and triggers; the authorizer allows
only SELECT, reads of the sample tables (and of CTEs) and the allowed functions.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from orchestrator.tools.sql.bounds import Limits
from orchestrator.tools.sql.policy import MAX_QUERY_CHARS, MAX_TREE_DEPTH, SqlPolicy

SQLITE_MAX_VALUE_BYTES = Limits().max_value_bytes  # SQLITE_LIMIT_LENGTH


def open_read_only(
    path: Path, policy: SqlPolicy | None, other_tables: frozenset[str] = frozenset()
) -> sqlite3.Connection:
    """A read-only connection to `path` with the engine limits set; with a policy, its
    authorizer too (`other_tables`: names in the file that are not sample tables)."""
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
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
    if policy is not None:
        db.set_authorizer(authorizer(policy, other_tables))
    return db


def authorizer(policy: SqlPolicy, other_tables: frozenset[str]) -> Any:
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
