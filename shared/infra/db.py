"""PostgreSQL: the pool of a service, in its own schema, and its versioned migrations."""

from __future__ import annotations

import zlib
from pathlib import Path

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from shared.infra.internals import FairPool as FairPool
from shared.infra.internals import PoolExhausted as PoolExhausted

log = structlog.get_logger()


# SQLSTATE classes that say "not now" rather than "not this": connection exceptions, too many
# connections or out of memory, operator intervention (a shutdown, the statement timeout, a
# server starting up), transaction rollback (serialization, deadlock).
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "53", "57", "40"})


def transient(exc: BaseException) -> bool:
    """Whether the same work may succeed if tried again later: the database was busy, away or
    restarting (an OSError covers lost sockets and timeouts, PoolExhausted included)."""
    if isinstance(exc, asyncpg.PostgresError):
        return (exc.sqlstate or "")[:2] in TRANSIENT_SQLSTATE_CLASSES
    return isinstance(exc, OSError | asyncpg.InterfaceError)


async def create_pool(
    url: str,
    schema: str,
    size: int,
    acquire_timeout_s: float | None = None,
    statement_timeout_s: float | None = None,
) -> asyncpg.Pool:
    """A fair pool whose connections see the service's schema first; an acquire waits at most
    ``acquire_timeout_s`` and PostgreSQL cancels a statement after ``statement_timeout_s``."""
    server_settings = {"search_path": schema, "application_name": f"gin-{schema}"}
    if statement_timeout_s:
        server_settings["statement_timeout"] = str(int(statement_timeout_s * 1000))
    pool = FairPool(
        url,
        acquire_timeout_s=acquire_timeout_s,
        min_size=1,
        max_size=size,
        max_queries=50_000,
        reset=_keep_session,
        max_inactive_connection_lifetime=0,  # a timer per release and acquire cost more
        loop=None,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
        server_settings=server_settings,
    )
    await pool
    return pool


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's RESET ALL round trip on every release: no code here leaves session state
    behind (transactions end with their block; the relay removes its own listener)."""


def _lock_key(schema: str) -> int:
    return zlib.crc32(f"migrate:{schema}".encode())


async def migrate(conn: asyncpg.Connection, schema: str, *directories: Path) -> list[str]:
    """Apply the ``NNN_name.sql`` files of the directories not applied yet, by number, once.

    An advisory lock makes concurrent migrators (two replicas, a Job) wait for each other.
    """
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _lock_key(schema))
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".schema_migrations ('
            " version int PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {
            r["version"]
            for r in await conn.fetch(f'SELECT version FROM "{schema}".schema_migrations')
        }
        files = sorted(
            (int(p.name.split("_", 1)[0]), p) for d in directories for p in d.glob("*.sql")
        )
        for version, path in files:
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(f'SET LOCAL search_path TO "{schema}"')
                await conn.execute(path.read_text())
                await conn.execute(
                    f'INSERT INTO "{schema}".schema_migrations (version, name) VALUES ($1, $2)',
                    version,
                    path.name,
                )
            applied_now.append(path.name)
            log.info("migration_applied", schema=schema, migration=path.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _lock_key(schema))
    return applied_now


async def migrate_url(url: str, schema: str, *directories: Path) -> list[str]:
    """Run the migrations of one schema on a fresh connection."""
    conn = await asyncpg.connect(url)
    try:
        return await migrate(conn, schema, *directories)
    finally:
        await conn.close()


# A connection of the pool or a plain one: what every store function takes.
Conn = asyncpg.Connection | PoolConnectionProxy
