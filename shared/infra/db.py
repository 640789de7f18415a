"""PostgreSQL: the pool of a service, in its own schema, and its versioned migrations."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import NamedTuple

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from shared.infra.internals import FairPool as FairPool
from shared.infra.internals import PoolExhausted as PoolExhausted
from shared.infra.internals import refuses_writes
from shared.infra.tracing import on as tracing_on
from shared.infra.tracing import trace_statements

log = structlog.get_logger()


# SQLSTATE classes that say "not now" rather than "not this": connection exceptions, too many
# connections or out of memory, operator intervention (a shutdown, the statement timeout, a
# server starting up), transaction rollback (serialization, deadlock).
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "53", "57", "40"})


def transient(exc: BaseException) -> bool:
    """Whether the same work may succeed if tried again later: the database was busy, away or
    restarting (an OSError covers lost sockets and timeouts, PoolExhausted included), or in a
    failover: a server that was primary refuses writes (25006; the pool then replaces its
    connections, ``FairPool``), or no server answers as primary yet."""
    if isinstance(exc, asyncpg.PostgresError):
        return (exc.sqlstate or "")[:2] in TRANSIENT_SQLSTATE_CLASSES or refuses_writes(exc)
    if isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
        return True  # every host of the URL answered, none as primary (yet)
    if isinstance(exc, asyncpg.InternalClientError):
        # A session the server ended while it idled in a transaction: the next statement
        # finds the protocol mid-way ("cannot switch to state ...; another operation ...").
        return str(exc).startswith("cannot switch to state")
    return isinstance(exc, OSError | asyncpg.InterfaceError)


async def create_pool(
    url: str,
    schema: str,
    size: int,
    acquire_timeout_s: float | None = None,
    statement_timeout_s: float | None = None,
    on_wait: Callable[[float], None] | None = None,
) -> asyncpg.Pool:
    """A fair pool whose connections see the service's schema first; an acquire waits at most
    ``acquire_timeout_s`` (``on_wait`` is told how long each waited) and PostgreSQL cancels a
    statement after ``statement_timeout_s``."""
    server_settings = {"search_path": schema, "application_name": f"gin-{schema}"}
    if statement_timeout_s:
        server_settings["statement_timeout"] = str(int(statement_timeout_s * 1000))
    pool = FairPool(
        url,
        acquire_timeout_s=acquire_timeout_s,
        on_wait=on_wait,
        min_size=1,
        max_size=size,
        max_queries=50_000,
        reset=_keep_session,
        init=trace_statements if tracing_on() else None,  # statements' spans
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


NO_TRANSACTION = "-- migrate: no-transaction"
LOCK_TIMEOUT_S = 5.0  # a step waits this long for a lock, then gives up and tries again
LOCK_ATTEMPTS = 5
LOCK_RETRY_PAUSE_S = 2.0  # doubling between attempts, 10 s at most
LOCK_NOT_AVAILABLE = "55P03"


class MigrationRefused(RuntimeError):
    """The migrations on disk disagree with those applied: one was edited, renamed or lost."""


class Migration(NamedTuple):
    """One ``NNN_name.sql`` file."""

    version: int
    name: str
    sql: str
    checksum: str  # sha256 of the file's text
    transactional: bool  # False: its first line is NO_TRANSACTION

    def statements(self) -> list[str]:
        """A no-transaction file's statements, each ending with ``;`` at the end of a line
        (each runs on its own, as CREATE INDEX CONCURRENTLY needs)."""
        parts = re.split(r";[ \t]*(?:--[^\n]*)?$", self.sql, flags=re.MULTILINE)
        return [p.strip() for p in parts if _sql_in(p)]


def _sql_in(text: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in text.splitlines())


def migrations_in(*directories: Path) -> list[Migration]:
    """The migrations of the directories, by number (a number used twice is refused)."""
    found: dict[int, Migration] = {}
    for directory in directories:
        for path in directory.glob("*.sql"):
            version = int(path.name.split("_", 1)[0])
            sql = path.read_text()
            if version in found:
                raise MigrationRefused(f"{path.name} and {found[version].name} share a number")
            found[version] = Migration(
                version,
                path.name,
                sql,
                hashlib.sha256(sql.encode()).hexdigest(),
                not sql.lstrip().startswith(NO_TRANSACTION),
            )
    return [found[v] for v in sorted(found)]


async def migrate(
    conn: asyncpg.Connection,
    schema: str,
    *directories: Path,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> list[str]:
    """Apply the ``NNN_name.sql`` files of the directories not applied yet, by number, once.

    - Each applied file's sha256 is kept; a file edited (or renamed) after it was applied is
      refused (``MigrationRefused``) before anything runs: a migration that changes must be a
      new file. Files applied before checksums were kept get theirs recorded.
    - Each step waits ``lock_timeout_s`` at most for a lock (so a step stuck behind a long
      transaction does not hold every query on that table behind it), then is tried again,
      ``LOCK_ATTEMPTS`` times in all.
    - A file whose first line is ``-- migrate: no-transaction`` runs outside a transaction,
      statement by statement (``CREATE INDEX CONCURRENTLY``): each statement must be safe to
      run again, since a failure half-way leaves the earlier ones done.

    An advisory lock makes concurrent migrators (two replicas, a Job) wait for each other;
    they wait by polling, never inside a statement, whose snapshot would hold a concurrent
    index build up.
    """
    applied_now: list[str] = []
    files = migrations_in(*directories)
    while True:  # another process holds it: no event to wait on
        if await conn.fetchval("SELECT pg_try_advisory_lock($1)", _lock_key(schema)):
            break
        await asyncio.sleep(0.2)
    try:
        table = f'"{schema}".schema_migrations'
        # A service's own role owns its schema and may create no other (production: the
        # schema comes with the database, deploy/k8s/overlays/prod/postgres.yaml), and
        # CREATE SCHEMA IF NOT EXISTS asks for the database's CREATE even when it exists.
        if await conn.fetchval("SELECT to_regnamespace($1) IS NULL", f'"{schema}"'):
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} ("
            " version int PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        await conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS checksum text")
        done = {
            r["version"]: r
            for r in await conn.fetch(f"SELECT version, name, checksum FROM {table}")
        }
        for migration in files:
            applied = done.get(migration.version)
            if applied is None:
                continue
            if applied["name"] != migration.name:
                raise MigrationRefused(
                    f"migration {migration.version} of {schema} was applied as"
                    f" {applied['name']}, and is now {migration.name}"
                )
            if applied["checksum"] is None:
                await conn.execute(
                    f"UPDATE {table} SET checksum = $2 WHERE version = $1",
                    migration.version,
                    migration.checksum,
                )
            elif applied["checksum"] != migration.checksum:
                raise MigrationRefused(
                    f"{migration.name} of {schema} was edited after it was applied: write the"
                    " change as a new migration (or restore the file)"
                )
        for migration in files:
            if migration.version not in done:
                await _apply(conn, schema, migration, lock_timeout_s)
                applied_now.append(migration.name)
                log.info("migration_applied", schema=schema, migration=migration.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _lock_key(schema))
    return applied_now


async def _apply(
    conn: asyncpg.Connection, schema: str, migration: Migration, lock_timeout_s: float
) -> None:
    timeout = f"{int(lock_timeout_s * 1000)}ms"
    record = (
        f'INSERT INTO "{schema}".schema_migrations (version, name, checksum) VALUES ($1, $2, $3)'
    )
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        try:
            if migration.transactional:
                async with conn.transaction():
                    await conn.execute(f'SET LOCAL search_path TO "{schema}"')
                    await conn.execute(f"SET LOCAL lock_timeout = '{timeout}'")
                    await conn.execute(migration.sql)
                    await conn.execute(
                        record, migration.version, migration.name, migration.checksum
                    )
                return
            await conn.execute(f'SET search_path TO "{schema}"')
            await conn.execute(f"SET lock_timeout = '{timeout}'")
            try:
                for statement in migration.statements():
                    await conn.execute(statement)
                await conn.execute(record, migration.version, migration.name, migration.checksum)
            finally:
                await conn.execute("RESET search_path; RESET lock_timeout")
            return
        except asyncpg.PostgresError as exc:
            if exc.sqlstate != LOCK_NOT_AVAILABLE or attempt == LOCK_ATTEMPTS:
                raise
            log.warning(
                "migration_lock_timeout", schema=schema, migration=migration.name, attempt=attempt
            )
            await asyncio.sleep(min(LOCK_RETRY_PAUSE_S * 2.0 ** (attempt - 1), 10.0))


async def migrate_url(url: str, schema: str, *directories: Path) -> list[str]:
    """Run the migrations of one schema on a fresh connection."""
    conn = await asyncpg.connect(url)
    try:
        return await migrate(conn, schema, *directories)
    finally:
        await conn.close()


# A connection of the pool or a plain one: what every store function takes.
Conn = asyncpg.Connection | PoolConnectionProxy


@contextlib.asynccontextmanager
async def session_lock(pool: asyncpg.Pool, key: int) -> AsyncIterator[Conn | None]:
    """A connection of ``pool`` holding PostgreSQL's session advisory lock ``key`` for the
    block, or None when another session holds it (one replica at a time does the work). A
    block that fails ends the connection's session, which frees the lock whatever state it
    was left in (a cancelled statement, a lost server)."""
    async with pool.acquire() as conn:
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
            yield None
            return
        try:
            yield conn
        except BaseException:
            conn.terminate()
            raise
        await conn.execute("SELECT pg_advisory_unlock($1)", key)
