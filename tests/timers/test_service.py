"""The timer service reports on /healthz, /readyz and /metrics; its pending gauge counts the
deadlines due and not fired (issue 29: it consumes no table event, so it counts none)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

from shared.infra.settings import Settings
from tests.timers.conftest import TimerDb, metrics_of, open_timers, put_deadlines, timing

pytestmark = pytest.mark.usefixtures("clean_timers")
PENDING = "gin_timer_deadlines_pending"
FIRED = "gin_timer_deadlines_fired_total"


async def test_health_and_readiness(settings: Settings) -> None:
    async with open_timers(timing(settings, 60.0, 60.0)) as timers:
        async with timers.get("/healthz") as r:
            assert (r.status, await r.json()) == (200, {"status": "ok"})
        async with timers.get("/readyz") as r:
            assert (r.status, await r.json()) == (
                200,
                {"status": "ready", "checks": {"postgresql": "ok", "rabbitmq": "ok"}},
            )
        values = await metrics_of(timers)
        for kind in ("absence", "expiry"):
            for name in (PENDING, FIRED, "gin_timer_fire_lag_seconds_count"):
                assert values[(name, (("kind", kind),))] == 0
        assert ("gin_timer_expiry_resent_total", ()) in values
        assert ("gin_outbox_lag_seconds", ()) in values
        assert not [key for key in values if key[0].startswith("gin_timer_events")]


async def test_pending_counts_the_deadlines_due_and_not_fired(
    settings: Settings, tdb: TimerDb, synthetic: str
) -> None:
    s = timing(settings, absence_s=60.0, expiry_s=3600.0)
    now = datetime.now(UTC)
    past = now - timedelta(seconds=120)  # absence due; expiry (an hour) not
    soon = now - timedelta(seconds=30)  # absence not due yet
    await put_deadlines(
        tdb.conn,
        [
            (synthetic + "a", 0, past, 5, past, 5),
            (synthetic + "b", 1, past - timedelta(seconds=1), 7, past, 8),
            (synthetic + "c", 1, soon, 9, soon, 9),
        ],
    )
    absence = (PENDING, (("kind", "absence"),))
    expiry = (PENDING, (("kind", "expiry"),))
    fired = (FIRED, (("kind", "absence"),))
    # Holding the absence scan, the test keeps every replica from firing absences.
    hold = tdb.conn.transaction()
    await hold.start()
    try:
        assert await tdb.conn.fetchval(
            "SELECT scanned_to FROM scans WHERE kind = 'absence' FOR UPDATE"
        )
        async with open_timers(s) as timers:
            deadline = time.monotonic() + 5
            while (values := await metrics_of(timers))[absence] != 2:
                assert time.monotonic() < deadline, values[absence]
                await asyncio.sleep(0.1)
            assert (values[expiry], values[fired]) == (0, 0)
            await hold.rollback()
            deadline = time.monotonic() + 5
            while (values := await metrics_of(timers))[fired] != 2 or values[absence] != 0:
                assert time.monotonic() < deadline, (values[fired], values[absence])
                await asyncio.sleep(0.1)
            assert values[expiry] == 0
            assert set(await tdb.fired(synthetic + "a")) == {"absence"}
            assert await tdb.fired(synthetic + "c") == {}
    finally:
        if tdb.conn.is_in_transaction():
            await hold.rollback()
