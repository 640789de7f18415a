"""Deadlines survive a stopped service and are fired once by any number of replicas."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from services.timers.app import SCHEMA
from services.timers.deadlines import KINDS, Durations
from services.timers.firing import Firing
from services.timers.metrics import TimerMetrics
from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra import db
from shared.infra.settings import Settings
from tests.table.conftest import Tap, all_events, open_api
from tests.timers.conftest import (
    TimerDb,
    TimerProcess,
    metrics_of,
    open_timers,
    parse_time,
    put_deadlines,
    timing,
    until_status,
)
from tests.timers.test_absence import claimable

pytestmark = pytest.mark.usefixtures("clean_timers")


async def test_stopped_across_a_deadline_then_started_again_fires_it_once(
    settings: Settings, tdb: TimerDb, tmp_path: Path
) -> None:
    absence_s = 2.0
    s = timing(settings, absence_s=absence_s, expiry_s=60.0)
    first = TimerProcess(s, tmp_path / "timers-1.log")
    second = TimerProcess(s, tmp_path / "timers-2.log")
    try:
        await first.start()
        async with (
            open_api(s, clock=time.time) as api,
            Tap(s, EVENTS_EXCHANGE, "timer.*.absence_claimable") as tap,
        ):
            table_id, ana, bia = await api.table_for_two()
            tokens = [ana, bia]
            n = (await api.view(table_id))["hand"]["to_act"]
            assert await first.stop() == 0, first.output()

            # While no timer service runs: a move (its new deadline saved with it, replacing
            # the old one), then both the replaced deadline and the new one pass.
            status, body = await api.command(table_id, tokens[n], type="pass_upcard")
            assert status == 200, body
            passed = body["events"][-1]
            await asyncio.sleep(parse_time(passed["occurred_at"]) + absence_s + 0.2 - time.time())
            assert await claimable(tap, table_id, 0.2) == []

            await second.start()
            got = await claimable(tap, table_id, 10.0)
            got += await claimable(tap, table_id, 1.0)  # and no second one
            assert [(g["data"]["seat"], g["data"]["since"]) for g in got] == [
                (1 - n, passed["occurred_at"])
            ], got
            status, body = await api.command(table_id, tokens[n], type="claim_absence")
            assert status == 200, body
            fired = [r for r in second.logged("deadline_fired") if r["table_id"] == table_id]
            assert [(r["kind"], r["seat"], r["attempt"]) for r in fired] == [
                ("absence", 1 - n, 1)
            ], second.output()
            assert fired[0]["lag_s"] >= 0
            assert await second.stop() == 0, second.output()
    finally:
        for proc in (first, second):
            if proc.proc is not None and proc.proc.returncode is None:
                await proc.stop()


async def test_two_replicas_fire_each_deadline_once(settings: Settings, tdb: TimerDb) -> None:
    s = timing(settings, absence_s=1.0, expiry_s=2.0, timer_poll_s=0.05)
    async with (
        open_timers(s) as one,
        open_timers(s) as two,
        open_api(s, clock=time.time) as api,
        Tap(s, EVENTS_EXCHANGE, "timer.*.absence_claimable") as tap,
    ):
        tables = [(await api.table_for_two())[0] for _ in range(5)]
        for table_id in tables:
            await until_status(api, table_id, "expired")
        announced = [b["table_id"] for b in await tap.drain(0.5)]
        for table_id in tables:
            assert announced.count(table_id) == 1, announced
            assert len(await tdb.expire_commands(table_id)) == 1
            events = await all_events(api, table_id)
            assert [e["type"] for e in events].count("table_expired") == 1
        fired = {"absence": 0.0, "expiry": 0.0}
        for replica in (one, two):
            values = await metrics_of(replica)
            for kind in fired:
                fired[kind] += values.get(
                    ("gin_timer_deadlines_fired_total", (("kind", kind),)), 0.0
                )
        assert fired == {"absence": 5, "expiry": 5}


async def test_replicas_racing_for_due_deadlines_take_each_once(
    settings: Settings, tdb: TimerDb, synthetic: str
) -> None:
    """Four firing loops on their own pools, all at once, over 300 due deadlines."""
    past = datetime.now(UTC) - timedelta(hours=3)
    await put_deadlines(
        tdb.conn,
        [
            (
                f"{synthetic}{i}",
                i % 2,
                past + timedelta(milliseconds=i),
                2 * i + 5,
                past + timedelta(milliseconds=i),
                2 * i + 6,
            )
            for i in range(150)
        ],
    )
    durations = Durations(absence_after_s=60.0, expiry_after_s=3600.0)
    pools: list[asyncpg.Pool] = []
    try:
        for _ in range(4):
            pools.append(await db.create_pool(settings.database_url, SCHEMA, 2))
        firings = [
            Firing(
                pool,
                settings.prefix,
                time.time,
                TimerMetrics(CollectorRegistry()),
                durations,
                batch=7,
            )
            for pool in pools
        ]

        async def drain(firing: Firing) -> int:
            total = 0
            while True:
                counts = [await firing.fire_due(kind) for kind in KINDS]
                total += sum(n or 0 for n in counts)
                if counts == [0, 0]:
                    return total
                if None in counts:  # another replica holds that kind: look again shortly
                    await asyncio.sleep(0.001)

        totals = await asyncio.gather(*(drain(f) for f in firings))
    finally:
        for pool in pools:
            await pool.close()
    assert sum(totals) == 300
    assert sum(1 for t in totals if t) >= 2, totals  # they did race
    ids = await tdb.conn.fetch("SELECT message_id FROM outbox")
    assert len(ids) == len({r["message_id"] for r in ids}) == 300
    rows = await tdb.conn.fetch(
        "SELECT table_id, kind, seq, attempts, next_at IS NULL AS done FROM fired"
        " WHERE table_id LIKE $1",
        synthetic + "%",
    )
    assert len(rows) == 300
    assert {(r["kind"], r["attempts"], r["done"]) for r in rows} == {
        ("absence", 1, True),  # announced once, never again
        ("expiry", 1, False),  # sent again later unless the table reports its expiry
    }
    for r in rows:  # each the deadline's own event
        i = int(r["table_id"].removeprefix(synthetic))
        assert r["seq"] == 2 * i + (5 if r["kind"] == "absence" else 6)
