"""The event log by month (issue 32, part 2), against the real PostgreSQL: the maintenance task
makes each month's partition ahead by the service's clock, each event lands in its month's,
one whose month has none lands in the default partition and goes to its own when the task
makes it, and a table's log reads back whole across months (the reads prune by month)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from services.table import maintenance
from services.table.maintenance import months_from, partition_name
from shared.infra.db import Conn
from shared.infra.settings import Settings
from tests.table.conftest import Api, Clock, all_events
from tests.table.test_retention import connection, first_move, gave_way, replica, run


def clock_at(*when: int) -> Clock:
    return Clock(datetime(*when, tzinfo=UTC).timestamp())  # type: ignore[misc]


def quiet(settings: Settings) -> Settings:
    """No run of the task but the one at start and the test's."""
    return msgspec.structs.replace(settings, maintenance_every_s=3600.0)


async def homes(conn: Conn, table_id: str) -> list[tuple[int, str]]:
    """Each event of a table, by seq, with the partition it is stored in."""
    rows = await conn.fetch(
        "SELECT seq, tableoid::regclass::text FROM events WHERE table_id = $1 ORDER BY seq",
        table_id,
    )
    return [(r[0], r[1]) for r in rows]


async def bounds(conn: Conn, name: str) -> str | None:
    value: str | None = await conn.fetchval(
        "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c"
        " JOIN pg_inherits i ON i.inhrelid = c.oid"
        " WHERE c.oid = to_regclass($1) AND i.inhparent = 'events'::regclass",
        name,
    )
    return value


async def move(api: Api, table_id: str, tokens: list[str]) -> dict[str, Any]:
    token, body = await first_move(api, table_id, tokens)
    status, answer = await api.command(table_id, token, **body)
    assert status == 200, answer
    return answer  # type: ignore[no-any-return]


def test_the_months_ahead_run_over_the_year() -> None:
    firsts = months_from(datetime(2031, 11, 30, 23, 59, tzinfo=UTC), 3)
    assert [partition_name(f) for f in firsts] == [
        "events_2031_11",
        "events_2031_12",
        "events_2032_01",
    ]
    assert firsts[2] == datetime(2032, 1, 1, tzinfo=UTC)


async def test_months_are_made_ahead_by_the_service_clock_and_events_land_in_theirs(
    settings: Settings,
) -> None:
    clock = clock_at(2031, 5, 10, 12)
    async with replica(quiet(settings), clock) as (api, maintenance), connection(settings) as db:
        await run(maintenance)
        assert await bounds(db, "events_2031_05") == (
            "FOR VALUES FROM ('2031-05-01 00:00:00+00') TO ('2031-06-01 00:00:00+00')"
        )
        assert await bounds(db, "events_2031_06") is not None
        assert await bounds(db, "events_2031_07") is not None
        assert await bounds(db, "events_2031_08") is None  # two months ahead, no more
        assert (await run(maintenance))["partitions"] == 0  # made once
        # What the task made is a partition as the migration's are: the log's key, no CHECK
        # left behind.
        assert await db.fetchval(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index"
            " WHERE indrelid = 'events_2031_06'::regclass AND indisprimary"
        ) == (
            "CREATE UNIQUE INDEX events_2031_06_pkey ON gin_table.events_2031_06"
            " USING btree (table_id, seq, at)"
        )
        assert not await db.fetchval(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = 'events_2031_06'::regclass"
            " AND contype = 'c'"
        )

        table_id, a, b = await api.table_for_two()
        await move(api, table_id, [a, b])
        stored = await homes(db, table_id)
        assert len(stored) > 3
        assert {home for _, home in stored} == {"events_2031_05"}


async def test_a_month_without_its_partition_falls_into_default_then_goes_to_its_own(
    settings: Settings,
) -> None:
    clock = clock_at(2032, 2, 20, 8)
    async with replica(quiet(settings), clock) as (api, maintenance), connection(settings) as db:
        await run(maintenance)  # February to April
        table_id, a, b = await api.table_for_two()
        await move(api, table_id, [a, b])
        february = await homes(db, table_id)
        assert {home for _, home in february} == {"events_2032_02"}

        clock.advance(150 * 86400)  # mid-July: no partition of it yet (the task ran in February)
        await move(api, table_id, [a, b])
        july = (await homes(db, table_id))[len(february) :]
        assert july
        assert {home for _, home in july} == {"events_default"}
        # An event of a month the task does not make now stays where it is.
        await db.execute(
            "INSERT INTO events (table_id, seq, type, envelope, at)"
            " VALUES ('far-off', 1, 'x', '{}', '2040-01-15 00:00+00')"
        )
        log = await all_events(api, table_id)  # across months and the default partition
        assert [e["seq"] for e in log] == list(range(1, len(february) + len(july) + 1))

        assert (await run(maintenance))["partitions"] == 3  # July to September
        assert {home for _, home in (await homes(db, table_id))[len(february) :]} == {
            "events_2032_07"
        }
        assert await homes(db, table_id) == february + [(seq, "events_2032_07") for seq, _ in july]
        assert (
            await db.fetchval(
                "SELECT tableoid::regclass::text FROM events WHERE table_id = 'far-off'"
            )
            == "events_default"
        )
        assert await all_events(api, table_id) == log

        answer = await move(api, table_id, [a, b])  # July's next event: straight to its own
        last = answer["events"][-1]["seq"]
        assert (await homes(db, table_id))[-1] == (last, "events_2032_07")
        assert [e["seq"] for e in await all_events(api, table_id)] == list(range(1, last + 1))
        await db.execute("DELETE FROM events WHERE table_id = 'far-off'")


async def test_a_replica_whose_clock_is_behind_at_a_month_end_loses_no_event(
    settings: Settings,
) -> None:
    """A table made by one replica just after midnight of the 1st, moved by another whose
    clock is seconds behind: its events are in the month before its creation, and read."""
    ahead, behind = clock_at(2033, 3, 1, 0, 0, 10), clock_at(2033, 2, 28, 23, 59, 50)
    async with (
        replica(quiet(settings), ahead) as (one, _),
        replica(quiet(settings), behind) as (two, maintenance),
        connection(settings) as db,
    ):
        await run(maintenance)
        table_id, a, b = await one.table_for_two()
        await move(two, table_id, [a, b])
        stored = await homes(db, table_id)
        assert {home for _, home in stored} == {"events_2033_03", "events_2033_02"}
        log = await all_events(one, table_id)
        assert [e["seq"] for e in log] == [seq for seq, _ in stored]


async def test_making_a_month_gives_way_to_a_reader_and_never_holds_a_move(
    settings: Settings,
) -> None:
    clock = clock_at(2034, 6, 10)
    async with (
        replica(quiet(settings), clock) as (api, maintenance),
        connection(settings) as db,
        connection(settings) as reader,
    ):
        await run(maintenance)  # June to August
        table_id, a, b = await api.table_for_two()
        clock.advance(92 * 86400)  # September: its partition is the next to make
        async with reader.transaction():  # a long read of the log holds every partition
            await reader.fetch("SELECT count(*) FROM events")
            done = await asyncio.wait_for(run(maintenance), 5.0)
            assert done["partitions"] == 0
            assert await bounds(db, "events_2034_09") is None
            # A move meanwhile (its events into the default partition) waits on nothing.
            await asyncio.wait_for(move(api, table_id, [a, b]), 5.0)
        assert gave_way(maintenance, "partitions") == 1
        assert (await run(maintenance))["partitions"] == 3
        assert {home for _, home in await homes(db, table_id)} == {
            "events_2034_06",
            "events_2034_09",
        }


async def test_a_month_left_empty_is_dropped_once_it_has_settled(settings: Settings) -> None:
    """Once every table of a past month is archived (its rows deleted), the month's partition
    is detached and dropped; a month that still has rows, the current month and one that
    ended within ``SETTLE`` stay; a partition another transaction is reading gives way."""
    clock = clock_at(2036, 1, 20)
    async with (
        replica(quiet(settings), clock) as (api, maintenance),
        connection(settings) as db,
        connection(settings) as reader,
    ):
        await run(maintenance)  # January to March
        table_id, a, b = await api.table_for_two()
        await move(api, table_id, [a, b])
        assert {home for _, home in await homes(db, table_id)} == {"events_2036_01"}

        clock.advance(40 * 86400)  # 1 March: February ended a day ago, not yet settled
        done = await run(maintenance)
        assert done["empty_months"] == 0
        assert await bounds(db, "events_2036_02") is not None

        clock.advance(5 * 86400)  # 6 March: February has settled, and is empty
        done = await run(maintenance)
        assert done["empty_months"] == 1
        assert await bounds(db, "events_2036_02") is None
        assert await db.fetchval("SELECT to_regclass('events_2036_02')") is None
        assert await bounds(db, "events_2036_01") is not None  # it still has the table's rows
        assert await bounds(db, "events_2036_03") is not None  # the current month, empty

        count = len(await homes(db, table_id))
        await db.execute("DELETE FROM events WHERE table_id = $1", table_id)  # as archived
        async with reader.transaction():  # a read of January holds it: the drop gives way
            await reader.fetch("SELECT count(*) FROM events_2036_01")
            done = await asyncio.wait_for(run(maintenance), 5.0)
            assert await bounds(db, "events_2036_01") is not None
        assert gave_way(maintenance, "empty_months") >= 1
        assert (await run(maintenance))["empty_months"] >= 1
        assert await db.fetchval("SELECT to_regclass('events_2036_01')") is None
        assert count > 3
        # a table's log still reads, and a new move still lands in its month
        await move(api, table_id, [a, b])
        assert {home for _, home in await homes(db, table_id)} == {"events_2036_03"}


async def test_a_move_routed_to_default_while_its_month_is_made_is_not_refused(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move whose event of a month with no partition yet would go to the default partition
    comes while the task makes that month: it waits, then lands in the new partition. Were it
    routed to the default first and written after the month was attached, PostgreSQL would
    refuse the row (the default's bounds changed under it): a move answered 500. The order is
    forced: a reader holds the default partition, the task waits for it, the move comes."""
    monkeypatch.setattr(maintenance, "_SHORT_LOCK_WAIT", "SET LOCAL lock_timeout = '10s'")
    month = datetime(2038, 3, 1, tzinfo=UTC)
    async with (
        replica(quiet(settings), clock_at(2045, 1, 1)) as (_, task_of_the_app),
        connection(settings) as task,
        connection(settings) as reader,
        connection(settings) as mover,
        connection(settings) as db,
    ):
        await run(task_of_the_app)  # its run at start is over: the schema is there, 2045 made
        assert await bounds(db, "events_2038_03") is None
        reading = reader.transaction()
        await reading.start()
        await reader.execute("LOCK TABLE events_default IN ACCESS SHARE MODE")
        making = asyncio.create_task(maintenance.make_month(task, month))
        await waiting_for_a_lock(db, task)
        moving = asyncio.create_task(
            mover.execute(
                "INSERT INTO events (table_id, seq, type, envelope, at)"
                " VALUES ('raced', 1, 'x', '{}', '2038-03-15 12:00+00')"
            )
        )
        await waiting_for_a_lock(db, mover)
        await reading.commit()
        assert await asyncio.wait_for(making, 10) is True
        await asyncio.wait_for(moving, 10)  # not refused
        assert await homes(db, "raced") == [(1, "events_2038_03")]
        await db.execute("DELETE FROM events WHERE table_id = 'raced'")


async def waiting_for_a_lock(db: Conn, conn: Conn) -> None:
    """Until ``conn``'s backend waits for a lock."""
    pid = conn.get_server_pid()
    async with asyncio.timeout(10):
        while not await db.fetchval(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", pid
        ):
            await asyncio.sleep(0.01)
