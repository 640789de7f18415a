"""Command answers kept a while (issue 32, part 1), against the real PostgreSQL: an answer is
found again by a retry within ``command_retention_s``; after it the maintenance task has
deleted it, in batches that hold no lock a move waits on, and a retry gets the documented
refusal without a second move. One replica's task works at a time."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from services.table.app import MAINTENANCE, create_app
from services.table.maintenance import _DELETE_ANSWERS, Maintenance
from shared.infra.db import Conn
from shared.infra.settings import Settings
from tests.table.conftest import Api, Clock, SeededShuffle, assert_error, connection, serving

RETENTION_S = 60.0


def kept_a_minute(settings: Settings, **more: Any) -> Settings:
    """A retention of a minute, and no run of the task but the one at start and the test's."""
    return msgspec.structs.replace(
        settings, command_retention_s=RETENTION_S, maintenance_every_s=3600.0, **more
    )


@contextlib.asynccontextmanager
async def replica(settings: Settings, clock: Clock) -> AsyncIterator[tuple[Api, Maintenance]]:
    """The real app with its maintenance task (started, its first run under way or done)."""
    app = create_app(settings, clock=clock, shuffle=SeededShuffle(7))
    async with serving(app) as client:
        yield Api(client, settings), app[MAINTENANCE]


async def run(maintenance: Maintenance, within_s: float = 10.0) -> dict[str, int]:
    """One run of the task, once the lock is free (the run at start may hold it)."""
    deadline = time.monotonic() + within_s
    while (done := await maintenance.run_once()) is None:
        assert time.monotonic() < deadline, "the maintenance lock was never free"
        await asyncio.sleep(0.02)
    return done


async def answers_of(conn: Conn, table_id: str) -> int:
    value: int = await conn.fetchval("SELECT count(*) FROM commands WHERE table_id = $1", table_id)
    return value


async def first_move(api: Api, table_id: str, tokens: list[str]) -> tuple[str, dict[str, Any]]:
    """A legal command of the seat to act (as its client builds it): its token and body."""
    view = await api.view(table_id, tokens[0])
    seat = view["hand"]["to_act"]
    view = await api.view(table_id, tokens[seat])
    return tokens[seat], {**view["legal"][0], "expected_version": view["version"]}


async def test_a_retry_is_answered_its_result_within_retention_and_refused_stale_after(
    settings: Settings,
) -> None:
    clock = Clock()
    async with replica(kept_a_minute(settings), clock) as (api, maintenance):
        table_id, a, b = await api.table_for_two()
        token, body = await first_move(api, table_id, [a, b])
        status, first = await api.command(table_id, token, command_id="k-1", **body)
        assert status == 200, first

        clock.advance(RETENTION_S - 1)  # a retry within retention: the very first answer
        await run(maintenance)
        assert await api.command(table_id, token, command_id="k-1", **body) == (200, first)

        clock.advance(2)  # past it: the task deletes the answer
        async with connection(settings) as conn:
            assert await answers_of(conn, table_id) == 1
            done = await run(maintenance)
            assert done["command_answers"] >= 1
            assert await answers_of(conn, table_id) == 0
            events = await conn.fetchval(
                "SELECT count(*) FROM events WHERE table_id = $1", table_id
            )
            # The retry is decided afresh: the table has moved past the version it names.
            status, refusal = await api.command(table_id, token, command_id="k-1", **body)
            assert_error(status, refusal, 409, "stale_version", None)
            assert (await api.view(table_id, token))["version"] == first["version"]
            assert (
                await conn.fetchval("SELECT count(*) FROM events WHERE table_id = $1", table_id)
                == events
            )
            # Without expected_version it is a new command at the table as it is now, where
            # the game refuses it: that seat's first decision is made.
            blind = {k: v for k, v in body.items() if k != "expected_version"}
            status, refusal = await api.command(table_id, token, command_id="k-1", **blind)
            assert status == 409, refusal
            assert (await api.view(table_id, token))["version"] == first["version"]


async def old_answers(conn: Conn, prefix: str, count: int, at: datetime) -> None:
    """``count`` answers of tables ``<prefix>-<n>``, given at ``at``, and a second apart."""
    await conn.execute(
        "INSERT INTO commands (table_id, command_id, actor, result, answered_at)"
        " SELECT $1 || '-' || n, 'c', 'person:x', '{}', $2::timestamptz + n * interval '1 second'"
        " FROM generate_series(1, $3) AS n",
        prefix,
        at,
        count,
    )


async def test_answers_go_in_batches_each_committed_and_newer_ones_stay(
    settings: Settings,
) -> None:
    clock = Clock()
    now = datetime.fromtimestamp(clock(), UTC)
    async with (
        replica(kept_a_minute(settings, maintenance_batch=50), clock) as (_, maintenance),
        connection(settings) as conn,
    ):
        await run(maintenance)  # any answer older than the minute goes first
        # The oldest of all (year 2000: first in every batch), then some within the minute.
        await old_answers(conn, "batch-old", 230, datetime(2000, 1, 1, tzinfo=UTC))
        await old_answers(conn, "batch-new", 20, now - timedelta(seconds=30))
        maintenance.pause_s = 0.1
        counts: list[int] = []
        running = asyncio.create_task(run(maintenance))
        while not running.done():
            counts.append(
                await conn.fetchval("SELECT count(*) FROM commands WHERE table_id LIKE 'batch-%'")
            )
            await asyncio.sleep(0.01)
        done = running.result()
        assert done["command_answers"] == 230
        left = await conn.fetch("SELECT table_id FROM commands WHERE table_id LIKE 'batch-%'")
        assert sorted(r[0] for r in left) == sorted(f"batch-new-{n}" for n in range(1, 21))
        # Each batch committed on its own: between them others see 250 - 50k rows (and the
        # 20 kept, once the last, of 30, is done).
        seen = set(counts) - {250, 20}
        assert {200, 150, 100, 50} & seen, counts
        assert all((250 - c) % 50 == 0 for c in seen), counts


async def test_a_batch_holds_no_lock_a_move_waits_on(settings: Settings) -> None:
    clock = Clock()
    async with (
        replica(kept_a_minute(settings), clock) as (api, maintenance),
        connection(settings) as batch,
        connection(settings) as other,
    ):
        table_id, a, b = await api.table_for_two()
        token, body = await first_move(api, table_id, [a, b])
        status, first = await api.command(table_id, token, command_id="k-1", **body)
        assert status == 200, first
        clock.advance(RETENTION_S + 1)
        await old_answers(batch, "held", 10, datetime(2000, 1, 1, tzinfo=UTC))
        cutoff = datetime.fromtimestamp(clock(), UTC) - timedelta(seconds=RETENTION_S)

        # A batch's transaction, open: it has deleted this table's answer, not committed.
        async with batch.transaction():
            await batch.execute(_DELETE_ANSWERS, cutoff, 1_000_000)
            # A retry reads the answer from before the delete, and the next move commits,
            # neither waiting on the batch.
            retried = await asyncio.wait_for(
                api.command(table_id, token, command_id="k-1", **body), 2.0
            )
            assert retried == (200, first)
            view = await api.view(table_id, token)
            seat = view["hand"]["to_act"]
            mover = [a, b][seat]
            legal = (await api.view(table_id, mover))["legal"][0]
            status, second = await asyncio.wait_for(
                api.command(table_id, mover, command_id="k-2", **legal), 2.0
            )
            assert status == 200, second

        # Rows another transaction holds are skipped, not waited for; the rest go.
        await old_answers(batch, "held-again", 3, datetime(2000, 1, 1, tzinfo=UTC))
        async with other.transaction():
            await other.execute("SELECT FROM commands WHERE table_id = 'held-again-1' FOR UPDATE")
            # held-again-1 is the oldest: a batch that waited for it would delete none.
            await asyncio.wait_for(run(maintenance), 5.0)
            left = await batch.fetch("SELECT table_id FROM commands WHERE table_id LIKE 'held%'")
            assert [r[0] for r in left] == ["held-again-1"]

        # A lock on the whole table (DDL, say): the batch gives way after its lock_timeout and
        # the run ends; the next run deletes what is left.
        await old_answers(batch, "gave-way", 3, datetime(2000, 1, 1, tzinfo=UTC))
        before = gave_way(maintenance)
        async with other.transaction():
            await other.execute("LOCK TABLE commands IN SHARE MODE")
            done = await asyncio.wait_for(run(maintenance), 5.0)  # the lock is held until after
            assert done["command_answers"] == 0
        assert gave_way(maintenance) == before + 1
        assert (await run(maintenance))["command_answers"] == 4  # held-again-1 too
        assert not await batch.fetchval(
            "SELECT count(*) FROM commands WHERE table_id LIKE 'held%' OR table_id LIKE 'gave%'"
        )


def gave_way(maintenance: Maintenance, step: str = "command_answers") -> float:
    """How many times a step gave way to a lock, so far."""
    return sum(
        sample.value
        for metric in maintenance.metrics.gave_way.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels == {"step": step}
    )


async def test_one_replica_works_at_a_time(settings: Settings) -> None:
    kept = kept_a_minute(settings)
    spans: list[tuple[str, float, float]] = []

    def slow(name: str) -> Any:
        async def step(_conn: Conn, _now: datetime) -> int:
            began = time.monotonic()
            await asyncio.sleep(0.3)
            spans.append((name, began, time.monotonic()))
            return 1

        return step

    async with replica(kept, Clock()) as (_, one), replica(kept, Clock()) as (_, two):
        await run(one)
        await run(two)  # both runs at start are over
        one.steps.append(("slow", slow("one")))
        two.steps.append(("slow", slow("two")))
        results = await asyncio.gather(one.run_once(), two.run_once())
        assert sorted(r is None for r in results) == [False, True], results
        # While the one holds the lock, the other only looks, then each in turn works.
        for _ in range(3):
            await asyncio.gather(run(one), run(two))
        spans.sort(key=lambda s: s[1])
        assert len(spans) == 7
        for (_, _, ended), (_, began, _) in itertools.pairwise(spans):
            assert began >= ended, spans
        assert {name for name, _, _ in spans} == {"one", "two"}


@pytest.mark.parametrize("failing", [RuntimeError("boom"), asyncio.CancelledError()])
async def test_a_run_that_fails_frees_the_lock(settings: Settings, failing: BaseException) -> None:
    kept = kept_a_minute(settings)
    async with replica(kept, Clock()) as (_, one), replica(kept, Clock()) as (_, two):
        await run(one)
        await run(two)  # both runs at start are over

        async def fail(_conn: Conn, _now: datetime) -> int:
            raise failing

        one.steps.insert(0, ("fails", fail))
        with pytest.raises(type(failing)):
            await run(one)
        await run(two)  # the lock went with the session, once the server saw it end
