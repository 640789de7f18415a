"""The chat kept a season (services/chat/retention.py), against real PostgreSQL: a table's chat
goes GIN_ARCHIVE_AFTER_S after the chat learned it closed or expired, by the chat's clock."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec
import pytest
from aiohttp import web

from services.chat import app as chat_app
from services.chat import retention
from shared.infra.db import create_pool
from shared.infra.service import POOL, SETTINGS
from shared.infra.settings import Settings
from tests.conftest import settings_of_their_own

AFTER_S = 3600.0
T = datetime(2027, 3, 1, tzinfo=UTC)
KINDS = ("tables", "seats", "messages", "applied_events")


@pytest.fixture
def own(settings: Settings) -> Iterator[Settings]:
    """A database of this test's own: the retention takes every chat ended long enough ago."""
    with settings_of_their_own(settings, f"chatret{time.monotonic_ns() % 10**9}") as own:
        yield own


@pytest.fixture
async def pool(own: Settings) -> AsyncIterator[asyncpg.Pool]:
    await chat_app.migrate(own)
    pool = await create_pool(own.database_url, chat_app.SCHEMA, 4)
    try:
        yield pool
    finally:
        await pool.close()


async def a_table(pool: asyncpg.Pool, status: str, messages: int = 3) -> str:
    """A table the chat knows, two seats, ``messages`` messages and its applied events."""
    table_id = uuid.uuid4().hex[:12]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO tables (table_id, status, last_message) VALUES ($1, $2, $3)",
            table_id,
            status,
            messages,
        )
        for seat in (0, 1):
            await conn.execute(
                "INSERT INTO seats (table_id, seat, player_id, name) VALUES ($1, $2, $3, $4)",
                table_id,
                seat,
                f"p{seat}",
                f"Player {seat}",
            )
            await conn.execute(
                "INSERT INTO applied_events (table_id, seq, type) VALUES ($1, $2, 'seat_taken')",
                table_id,
                seat + 1,
            )
        for n in range(1, messages + 1):
            await conn.execute(
                "INSERT INTO messages (table_id, seq, event_id, seat, player_id, name, text,"
                " posted_at) VALUES ($1, $2, $3, 0, 'p0', 'Player 0', 'oi', $4)",
                table_id,
                n,
                uuid.uuid4(),
                T,
            )
    return table_id


async def rows_of(pool: asyncpg.Pool, table_id: str) -> dict[str, int]:
    async with pool.acquire() as conn:
        return {
            kind: await conn.fetchval(f"SELECT count(*) FROM {kind} WHERE table_id = $1", table_id)
            for kind in KINDS
        }


async def test_a_chat_goes_the_delay_after_its_table_ended_and_no_sooner(
    pool: asyncpg.Pool,
) -> None:
    closed = await a_table(pool, "closed")
    expired = await a_table(pool, "expired", messages=0)
    open_ = await a_table(pool, "open")
    kept = await rows_of(pool, open_)

    # The first run sees them ended: their end is that run's moment.
    assert await retention.run_once(pool, T, AFTER_S, batch=1, pause_s=0) == 0
    async with pool.acquire() as conn:
        ended = dict(await conn.fetch("SELECT table_id, ended_at FROM tables"))
    assert ended == {closed: T, expired: T, open_: None}

    assert await retention.run_once(pool, T + timedelta(seconds=AFTER_S - 1), AFTER_S, 1) == 0
    assert (await rows_of(pool, closed))["messages"] == 3
    # A table that ends later counts from the run that sees it.
    later = await a_table(pool, "open")
    async with pool.acquire() as conn:
        await conn.execute("UPDATE tables SET status = 'closed' WHERE table_id = $1", later)

    assert await retention.run_once(pool, T + timedelta(seconds=AFTER_S), AFTER_S, 1) == 2

    for gone in (closed, expired):
        assert await rows_of(pool, gone) == dict.fromkeys(KINDS, 0)
    assert await rows_of(pool, open_) == kept
    assert (await rows_of(pool, later))["messages"] == 3
    assert await retention.run_once(pool, T + timedelta(seconds=2 * AFTER_S), AFTER_S, 1) == 1
    assert await rows_of(pool, later) == dict.fromkeys(KINDS, 0)


async def test_one_replica_runs_at_a_time_and_a_locked_table_waits(pool: asyncpg.Pool) -> None:
    closed = await a_table(pool, "closed")
    busy = await a_table(pool, "closed")
    assert await retention.run_once(pool, T, AFTER_S, 100) == 0
    async with pool.acquire() as other:
        await other.execute("SELECT pg_advisory_lock($1)", retention.LOCK_KEY)
        assert await retention.run_once(pool, T + timedelta(days=365), AFTER_S, 100) is None
        await other.execute("SELECT pg_advisory_unlock($1)", retention.LOCK_KEY)
        async with other.transaction():  # a posting holds one table's row
            await other.execute("SELECT FROM tables WHERE table_id = $1 FOR UPDATE", busy)
            later = T + timedelta(days=365)
            assert await retention.run_once(pool, later, AFTER_S, 100) == 1
    assert (await rows_of(pool, closed))["tables"] == 0
    assert (await rows_of(pool, busy))["tables"] == 1
    assert await retention.run_once(pool, T + timedelta(days=365), AFTER_S, 100) == 1


async def test_the_app_runs_it_only_with_an_archive(pool: asyncpg.Pool, own: Settings) -> None:
    closed = await a_table(pool, "closed")
    for archive_url, left in (("", 1), ("file:///tmp/gin-archive", 0)):
        app = web.Application()
        app[SETTINGS] = msgspec.structs.replace(
            own, archive_url=archive_url, archive_after_s=0.0, maintenance_every_s=0.05
        )
        app[POOL] = pool
        running = retention.running(app)
        await anext(running)
        try:
            deadline = asyncio.get_running_loop().time() + (0.5 if left else 10)
            while (await rows_of(pool, closed))["tables"] != left:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            assert (await rows_of(pool, closed))["tables"] == left
        finally:
            await anext(running, None)
