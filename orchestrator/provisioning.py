"""Provisioning of the SQL tool's sample database: an admin task, not part of a call.

`init_database` (run by `reason db init`) creates the sample schema, loads
`orchestrator/data/seed.sql` into it and makes the read-only reader role the tool
connects as, with `ROLE_SETTINGS` as its defaults (the PostgreSQL image's init step,
`docker/postgres/10-reason-data.sh`, gives the role the same; a deploy test ties the
two). `ensure_sqlite_database` builds the SQLite sample file the tool falls back to,
under the project's cache directory.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
from importlib import resources
from pathlib import Path

import asyncpg
import structlog

from orchestrator.tools.sql.bounds import Limits
from orchestrator.tools.sql.policy import plain_name
from services.settings import default_cache_dir
from services.toolspecs import SQL_SCHEMA as SCHEMA

log = structlog.get_logger("orchestrator.tools.sql")

READER_ROLE = "reason_reader"
# Role defaults: a backstop if a connection is ever used outside the tool's transaction.
ROLE_STATEMENT_TIMEOUT_MS = 5000
ROLE_LOCK_TIMEOUT_MS = 1000
ROLE_IDLE_IN_TRANSACTION_MS = 10_000
# Memory a sort or hash may use before spilling to disk (the size bounds count on it;
# the tool sets the same for each call).
WORK_MEM = f"{Limits().work_mem_bytes // 1024}kB"
# Role default for the disk a session's temporary files may take (set by a superuser).
ROLE_TEMP_FILE_LIMIT = "64MB"
ROLE_CONNECTION_LIMIT = 32
SQLITE_SUBDIR = "sql"  # the SQLite sample file's folder in the cache directory

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
    role, schema = plain_name(reader_role), plain_name(schema)
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
                log.warning(
                    "temp_file_limit not set for the reader role",
                    **{
                        "event.action": "sql.provision",
                        "labels.role": role,
                        "error.message": warnings[-1],
                    },
                )
            await conn.execute(f"ALTER ROLE {role} SET search_path = pg_catalog, {schema}, pg_temp")

            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            await conn.execute(f"CREATE SCHEMA {schema}")
            await conn.execute(f"SET LOCAL search_path = {schema}")
            await conn.execute(seed_sql())

            database = plain_name(await conn.fetchval("SELECT current_database()"))
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
    log.info(
        "sample schema and reader role ready",
        **{
            "event.action": "sql.provision",
            "event.outcome": "success",
            "labels.schema": schema,
            "labels.role": role,
        },
    )
    return warnings


def _seed_digest() -> str:
    return hashlib.sha256(seed_sql().encode()).hexdigest()


def default_sqlite_path(cache_dir: Path | None = None) -> Path:
    """The SQLite sample file: under the project's cache directory (or `cache_dir`),
    named by the seed's digest, so a changed seed gets a new file."""
    root = cache_dir or default_cache_dir()
    return root / SQLITE_SUBDIR / f"sample-{_seed_digest()[:12]}.sqlite3"


def ensure_sqlite_database(path: Path | None) -> Path:
    """The file the SQLite backend opens, built from the seed if it is missing: `path`,
    or the default file; where the cache directory cannot be written (a container user
    without a home), the default file's place under the temporary directory."""
    if path is None:
        path = default_sqlite_path()
        try:
            if not path.exists():
                build_sqlite_database(path)
        except OSError:
            path = default_sqlite_path(Path(tempfile.gettempdir()) / "reason")
            if not path.exists():
                build_sqlite_database(path)
    elif not path.exists():
        build_sqlite_database(path)
    return path


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
