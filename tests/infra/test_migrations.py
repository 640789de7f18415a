"""The migration runner (issue 14, part 8), on a real PostgreSQL: each applied file's checksum
is kept and an edited or renamed one is refused; each step waits a bounded time for its locks
(queries behind it are not held up for longer) and is tried again; a step can run outside a
transaction (CREATE INDEX CONCURRENTLY)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from structlog.testing import capture_logs

from shared.infra import db
from shared.infra.settings import Settings


@pytest.fixture
async def conn(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(settings.database_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def schema(settings: Settings) -> AsyncIterator[str]:
    name = f"mig_{uuid.uuid4().hex[:8]}"
    yield name
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


def write(directory: Path, name: str, sql: str) -> None:
    (directory / name).write_text(sql)


async def recorded(conn: asyncpg.Connection, schema: str) -> dict[str, str | None]:
    rows = await conn.fetch(f'SELECT name, checksum FROM "{schema}".schema_migrations')
    return {r["name"]: r["checksum"] for r in rows}


async def test_applied_once_with_their_checksums(
    conn: asyncpg.Connection, schema: str, tmp_path: Path
) -> None:
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int);")
    write(tmp_path, "002_b.sql", "ALTER TABLE a ADD COLUMN b text;")
    assert await db.migrate(conn, schema, tmp_path) == ["001_a.sql", "002_b.sql"]
    assert await db.migrate(conn, schema, tmp_path) == []
    sums = {m.name: m.checksum for m in db.migrations_in(tmp_path)}
    assert await recorded(conn, schema) == sums
    assert all(len(v) == 64 for v in sums.values())


async def test_an_edited_migration_is_refused_before_anything_runs(
    conn: asyncpg.Connection, schema: str, tmp_path: Path
) -> None:
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int);")
    await db.migrate(conn, schema, tmp_path)
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id bigint);")  # edited after it ran
    write(tmp_path, "002_b.sql", "CREATE TABLE b (id int);")
    with pytest.raises(db.MigrationRefused, match=r"001_a\.sql of .* was edited"):
        await db.migrate(conn, schema, tmp_path)
    assert list(await recorded(conn, schema)) == ["001_a.sql"]
    assert await conn.fetchval("SELECT to_regclass($1)", f"{schema}.b") is None
    # the lock is released: once the file is restored, the next run goes on
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int);")
    assert await db.migrate(conn, schema, tmp_path) == ["002_b.sql"]


async def test_a_renamed_migration_is_refused(
    conn: asyncpg.Connection, schema: str, tmp_path: Path
) -> None:
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int);")
    await db.migrate(conn, schema, tmp_path)
    (tmp_path / "001_a.sql").rename(tmp_path / "001_other.sql")
    with pytest.raises(db.MigrationRefused, match=r"applied as 001_a\.sql"):
        await db.migrate(conn, schema, tmp_path)


async def test_files_applied_before_checksums_get_theirs(
    conn: asyncpg.Connection, schema: str, tmp_path: Path
) -> None:
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int);")
    await db.migrate(conn, schema, tmp_path)
    await conn.execute(f'UPDATE "{schema}".schema_migrations SET checksum = NULL')
    assert await db.migrate(conn, schema, tmp_path) == []
    assert await recorded(conn, schema) == {"001_a.sql": db.migrations_in(tmp_path)[0].checksum}


async def test_a_step_behind_a_long_transaction_gives_up_its_lock_wait_and_tries_again(
    conn: asyncpg.Connection,
    schema: str,
    tmp_path: Path,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a lock_timeout the ALTER waits for the reader's transaction, and every query on
    the table queues behind the ALTER for as long: the table service stalls."""
    monkeypatch.setattr(db, "LOCK_RETRY_PAUSE_S", 0.5)
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int); INSERT INTO a VALUES (1);")
    await db.migrate(conn, schema, tmp_path)
    write(tmp_path, "002_b.sql", "ALTER TABLE a ADD COLUMN b text;")
    reader = await asyncpg.connect(settings.database_url)
    player = await asyncpg.connect(settings.database_url)
    try:
        long = reader.transaction()
        await long.start()
        await reader.fetchval(f'SELECT count(*) FROM "{schema}".a')  # holds ACCESS SHARE
        with capture_logs() as logs:
            migrating = asyncio.create_task(db.migrate(conn, schema, tmp_path, lock_timeout_s=0.3))
            await asyncio.sleep(0.1)  # the ALTER is waiting for the reader now
            started = time.monotonic()
            # a query arriving now waits behind the ALTER's lock request, for its timeout at most
            query = player.fetchval(f'SELECT count(*) FROM "{schema}".a')
            assert await asyncio.wait_for(query, 3) == 1
            waited = time.monotonic() - started
            await asyncio.sleep(0.5)
            await long.rollback()
            assert await asyncio.wait_for(migrating, 10) == ["002_b.sql"]
        assert waited < 1.0
        assert any(e["event"] == "migration_lock_timeout" for e in logs)
    finally:
        await reader.close()
        await player.close()


async def test_a_step_still_locked_out_after_every_attempt_fails(
    conn: asyncpg.Connection,
    schema: str,
    tmp_path: Path,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(db, "LOCK_RETRY_PAUSE_S", 0.01)
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int);")
    await db.migrate(conn, schema, tmp_path)
    write(tmp_path, "002_b.sql", "ALTER TABLE a ADD COLUMN b text;")
    reader = await asyncpg.connect(settings.database_url)
    try:
        async with reader.transaction():
            await reader.fetchval(f'SELECT count(*) FROM "{schema}".a')
            with pytest.raises(asyncpg.LockNotAvailableError):
                await db.migrate(conn, schema, tmp_path, lock_timeout_s=0.05)
    finally:
        await reader.close()
    assert list(await recorded(conn, schema)) == ["001_a.sql"]
    assert await db.migrate(conn, schema, tmp_path) == ["002_b.sql"]  # unlocked, it goes on


async def test_a_no_transaction_step_builds_an_index_concurrently(
    conn: asyncpg.Connection, schema: str, tmp_path: Path
) -> None:
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int, due timestamptz);")
    write(
        tmp_path,
        "002_index.sql",
        "-- migrate: no-transaction\n"
        "-- a build that failed half-way leaves an invalid index: dropped first, built again\n"
        "DROP INDEX CONCURRENTLY IF EXISTS a_due;\n"
        "CREATE INDEX CONCURRENTLY a_due ON a (due)\n"
        "    WHERE due IS NOT NULL; -- only the rows with a due time\n",
    )
    assert await db.migrate(conn, schema, tmp_path) == ["001_a.sql", "002_index.sql"]
    valid = await conn.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", f"{schema}.a_due"
    )
    assert valid is True
    assert await conn.fetchval("SHOW lock_timeout") == "0"  # the session is as it was
    assert await recorded(conn, schema) == {m.name: m.checksum for m in db.migrations_in(tmp_path)}


async def test_without_the_marker_a_concurrent_index_cannot_be_built(
    conn: asyncpg.Connection, schema: str, tmp_path: Path
) -> None:
    write(tmp_path, "001_a.sql", "CREATE TABLE a (id int);")
    write(tmp_path, "002_index.sql", "CREATE INDEX CONCURRENTLY a_id ON a (id);")
    with pytest.raises(asyncpg.ActiveSQLTransactionError):
        await db.migrate(conn, schema, tmp_path)
    assert list(await recorded(conn, schema)) == ["001_a.sql"]


def test_a_number_used_twice_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "001_a.sql", "SELECT 1;")
    write(tmp_path, "001_b.sql", "SELECT 2;")
    with pytest.raises(db.MigrationRefused, match="share a number"):
        db.migrations_in(tmp_path)
