"""The event consumer: a redelivered or repeated event changes nothing, a poison message is
dead-lettered, and the service reports on /healthz, /readyz and /metrics."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import aio_pika
import msgspec
import pytest

from services.timers.deadlines import MARGIN
from shared.contracts.envelope import Envelope, wrap
from shared.contracts.events import AnyEvent, UpcardPassed
from shared.contracts.names import EVENTS_EXCHANGE, table_event_key
from shared.infra.settings import Settings
from tests.timers.conftest import TimerDb, metrics_of, open_timers, timing
from tests.timers.test_deadlines import started

pytestmark = pytest.mark.usefixtures("clean_timers")


async def publish(settings: Settings, bodies: list[tuple[str, bytes]]) -> None:
    """Publish (routing key, body) pairs to the run's events exchange, in order."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(settings.prefix + EVENTS_EXCHANGE)
        for key, body in bodies:
            await exchange.publish(aio_pika.Message(body), routing_key=key)


def as_message(table_id: str, seq: int, event: AnyEvent, at: datetime) -> tuple[str, bytes]:
    envelope = wrap(table_id, seq, event, at)
    return table_event_key(table_id, envelope.type), msgspec.json.encode(envelope)


async def test_redelivered_repeated_and_poison_events(settings: Settings, tdb: TimerDb) -> None:
    s = timing(settings, absence_s=3600.0, expiry_s=7200.0)
    table_id = f"synthetic-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    first: list[Envelope] = started(dealer=1)  # seqs 1..5, the hand dealt by seat 1
    messages = [as_message(table_id, e.seq, e.data, now) for e in first]
    passed = as_message(table_id, 6, UpcardPassed(hand=1, seat=0), now + timedelta(seconds=1))
    # The relay republishes after a broker failure: repeats of seqs seen, and older ones.
    script = [
        *messages[:3],
        messages[1],
        *messages[3:],
        messages[0],
        messages[4],
        passed,
        messages[2],
        passed,
        (table_event_key(table_id, "seat_taken"), b'{"not": "an envelope"}'),
    ]
    async with open_timers(s) as timers:
        await publish(s, script)
        await tdb.until_applied(table_id, 6)
        deadline = time.monotonic() + 5
        while (values := await metrics_of(timers))[
            ("gin_timer_events_total", (("outcome", "rejected"),))
        ] < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert values[("gin_timer_events_total", (("outcome", "applied"),))] == 6
        assert values[("gin_timer_events_total", (("outcome", "duplicate"),))] == 5
        rows = await tdb.deadlines(table_id)
        at = now + timedelta(seconds=1)
        assert (rows["absence"]["seat"], rows["absence"]["seq"]) == (1, 6)  # the dealer
        assert rows["absence"]["due_at"] == at + timedelta(seconds=3600) + MARGIN
        assert (rows["expiry"]["seq"], rows["expiry"]["since"]) == (6, at)
        assert rows["expiry"]["due_at"] == at + timedelta(seconds=7200) + MARGIN
        pending = ("gin_timer_deadlines_pending", (("kind", "absence"),))
        deadline = time.monotonic() + 5
        while (await metrics_of(timers)).get(pending) != 1:
            assert time.monotonic() < deadline, "the pending gauge was not refreshed"
            await asyncio.sleep(0.1)

        # A late repeat (after more events) still changes nothing.
        await publish(s, [messages[2]])
        await asyncio.sleep(0.3)
        assert await tdb.last_seq(table_id) == 6
        assert (await tdb.deadlines(table_id))["absence"]["seq"] == 6


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
            for name in (
                "gin_timer_deadlines_pending",
                "gin_timer_deadlines_fired_total",
                "gin_timer_fire_lag_seconds_count",
            ):
                assert values[(name, (("kind", kind),))] == 0
        assert ("gin_outbox_lag_seconds", ()) in values
