"""A throw-away PostgreSQL database with the sample schema and its own reader role.

The database (`reason_test_<random>`) and the role (`reason_reader_<random>`) are created
through the admin DSN (the postgres superuser on the local server, or
`REASON_TEST_PG_ADMIN_DSN`), loaded with `init_database`, and dropped afterwards.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import pytest

from orchestrator.provisioning import SCHEMA, init_database

ADMIN_DSN = os.environ.get(
    "REASON_TEST_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass(frozen=True)
class SampleDatabase:
    name: str
    role: str
    admin_dsn: str  # superuser, connected to the test database
    reader_dsn: str  # the read-only role, connected to the test database


def _dsn_for(base: str, database: str, user: str | None = None) -> str:
    scheme, rest = base.split("://", 1)
    credentials, _, host_part = rest.rpartition("@")
    host = host_part.split("/", 1)[0].split("?", 1)[0]
    if user is not None:
        credentials = user
    return f"{scheme}://{credentials + '@' if credentials else ''}{host}/{database}"


async def _admin(statement: str) -> None:
    conn = await asyncpg.connect(ADMIN_DSN, timeout=5)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def sample_db() -> Iterator[SampleDatabase]:
    suffix = secrets.token_hex(4)
    name, role = f"reason_test_{suffix}", f"reason_reader_{suffix}"
    try:
        asyncio.run(_admin(f"CREATE DATABASE {name}"))
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {ADMIN_DSN} ({exc}); start it with "
            "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`"
        )
    db = SampleDatabase(
        name=name,
        role=role,
        admin_dsn=_dsn_for(ADMIN_DSN, name),
        reader_dsn=_dsn_for(ADMIN_DSN, name, user=role),
    )
    try:
        asyncio.run(init_database(db.admin_dsn, None, reader_role=role, schema=SCHEMA))
        yield db
    finally:
        asyncio.run(_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        asyncio.run(_admin(f"DROP ROLE IF EXISTS {role}"))
