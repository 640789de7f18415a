"""The timers' share of a season of data (issue 32, part 3): a table's timer-stream counter is
deleted once the table is archived (no deadlines row any more) and the counter has been idle
``GIN_ARCHIVE_AFTER_S``; a table that still has its deadlines row keeps its counter, and so
does an archived one whose counter was taken lately."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from services.table.app import migrate as migrate_table
from services.timers import retention, store
from services.timers.app import migrate
from shared.infra.db import create_pool
from shared.infra.settings import Settings
from tests.timers.conftest import put_deadlines

AFTER = timedelta(days=180)


async def test_an_archived_tables_counter_goes_once_idle_past_the_delay(
    settings: Settings, synthetic: str
) -> None:
    await migrate_table(settings)
    await migrate(settings)
    # Long before any other test's counters (they are taken at today's or later clocks), so
    # the run finds only this test's.
    now = datetime(2001, 6, 1, tzinfo=UTC)
    archived, recent, open_one = (synthetic + name for name in ("archived", "recent", "open"))
    pool = await create_pool(settings.database_url, "gin_timers", 2)
    try:
        async with pool.acquire() as conn:
            await put_deadlines(conn, [(open_one, 0, now, 3, now, 3)])
            for table_id, when in (
                (archived, now - AFTER - timedelta(days=1)),
                (recent, now - timedelta(days=1)),
                (open_one, now - AFTER - timedelta(days=1)),
            ):
                assert await store.next_announcement(conn, table_id, when) == 1
        assert await retention.run_once(pool, now, AFTER.total_seconds(), batch=1) == 1
        async with pool.acquire() as conn:
            kept = {
                r[0]
                for r in await conn.fetch(
                    "SELECT table_id FROM announcements WHERE table_id LIKE $1", synthetic + "%"
                )
            }
            assert kept == {recent, open_one}
            # the open table's numbering goes on where it was
            assert await store.next_announcement(conn, open_one, now) == 2
            await conn.execute("DELETE FROM announcements WHERE table_id LIKE $1", synthetic + "%")
    finally:
        await pool.close()


async def test_one_replica_at_a_time(settings: Settings) -> None:
    await migrate(settings)
    pool = await create_pool(settings.database_url, "gin_timers", 2)
    holder = await asyncpg.connect(settings.database_url)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", retention.LOCK_KEY)
        now = datetime(2040, 6, 1, tzinfo=UTC)
        assert await retention.run_once(pool, now, AFTER.total_seconds(), batch=10) is None
    finally:
        await holder.close()
        await pool.close()


async def test_an_archived_tables_firings_go_reminders_too(
    settings: Settings, synthetic: str
) -> None:
    """Issue 33: the firings of turn reminders (also of an offset no longer configured, which no
    look reaches to forget) go with the table's archive, like its counter."""
    await migrate_table(settings)
    await migrate(settings)
    now = datetime(2001, 6, 1, tzinfo=UTC)
    old = now - AFTER - timedelta(days=1)
    archived, open_one = synthetic + "archived-f", synthetic + "open-f"
    pool = await create_pool(settings.database_url, "gin_timers", 2)
    try:
        async with pool.acquire() as conn:
            await put_deadlines(conn, [(open_one, 0, old, 3, old, 3)])
            await conn.executemany(
                "INSERT INTO fired (table_id, kind, seq, since, fired_at, attempts)"
                " VALUES ($1, $2, 3, $3, $3, 1)",
                [
                    (table_id, kind, old)
                    for table_id in (archived, open_one)
                    for kind in ("absence", "reminder:86400", "reminder:7")
                ],
            )
        assert await retention.run_once(pool, now, AFTER.total_seconds(), batch=2) == 3
        async with pool.acquire() as conn:
            kept = await conn.fetch(
                "SELECT table_id, kind FROM fired WHERE table_id LIKE $1", synthetic + "%"
            )
            assert {(r["table_id"], r["kind"]) for r in kept} == {
                (open_one, "absence"),
                (open_one, "reminder:86400"),
                (open_one, "reminder:7"),
            }
            await conn.execute("DELETE FROM fired WHERE table_id LIKE $1", synthetic + "%")
    finally:
        await pool.close()
