"""How the outbox relay wakes: in-process after its own process commits, by another
replica's NOTIFY after that replica commits, and by the NOTIFY of a transaction (chat,
timers); never by its own NOTIFY, and otherwise only by polling (here: once a minute).
And what a batch publishes besides its rows: its events as one message, for the table
service's WebSocket hubs. And how published rows leave the outbox after their retention."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from shared.contracts.names import BOTS_EXCHANGE, EVENTS_EXCHANGE, SOCKETS_EXCHANGE
from shared.infra import amqp, db, outbox, tracing
from shared.infra.outbox import NOTIFY_CHANNEL, SQL_DIR, OutboxRelay, RelayMetrics
from shared.infra.settings import Settings
from tests.infra.cancelling import stops_when_cancelled
from tests.table.conftest import Tap

POLL_S = 60.0  # long enough that a publish within seconds was a wake-up, not a poll


class Replicas:
    """Two relays of one schema: ``running`` runs its loop (and sends each batch's events to
    ``gin.sockets`` too, as the table service's relay does), ``other`` only commits."""

    def __init__(
        self,
        schema: str,
        pool: asyncpg.Pool,
        running: OutboxRelay,
        other: OutboxRelay,
        make: Callable[..., OutboxRelay],
    ) -> None:
        self.schema = schema
        self.pool = pool
        self.running = running
        self.other = other
        self.make = make  # another relay of the schema: OutboxRelay's keyword arguments

    async def ids(self) -> dict[int, bool]:
        """Every row in the outbox: id, and whether it is published."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, published_at IS NOT NULL AS done FROM outbox")
        return {row["id"]: row["done"] for row in rows}

    async def commit(self, key: str, exchange: str = EVENTS_EXCHANGE) -> None:
        """Commit one outbox row, with no NOTIFY in the transaction."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO outbox (exchange, routing_key, body, message_id)"
                " VALUES ($1, $2, $3, $4)",
                exchange,
                key,
                b'{"key": "%s"}' % key.encode(),
                uuid.uuid4().hex,
            )

    async def notify(self, payload: str) -> None:
        """A NOTIFY on the relay's channel, as another process would send it."""
        async with self.pool.acquire() as conn:
            await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, payload)


@pytest.fixture
async def replicas(settings: Settings) -> AsyncIterator[Replicas]:
    schema = f"relay_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(settings.database_url)
    try:
        await db.migrate(conn, schema, SQL_DIR)
    finally:
        await conn.close()
    pool = await db.create_pool(settings.database_url, schema, 4)
    connection = await amqp.connect(settings.amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    exchanges = await amqp.declare_topology(channel, settings.prefix)

    def relay(**options: Any) -> OutboxRelay:
        metrics = RelayMetrics(CollectorRegistry())
        return OutboxRelay(
            pool, schema, channel, exchanges, metrics, **{"poll_s": POLL_S, **options}
        )

    running = relay(digest_to=SOCKETS_EXCHANGE)
    task = asyncio.create_task(running.run())
    await asyncio.sleep(0.3)  # listening, and past its first (empty) look at the outbox
    try:
        yield Replicas(schema, pool, running, relay(), relay)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await connection.close()
        async with pool.acquire() as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await pool.close()


async def keys_published(tap: Tap, within_s: float) -> list[str]:
    bodies = await tap.collect(lambda got: bool(got), within_s=within_s)
    return [body["key"] for body in bodies]


async def test_a_commit_in_this_process_wakes_its_relay(
    replicas: Replicas, settings: Settings
) -> None:
    key = f"relay.{uuid.uuid4().hex[:8]}.local"
    async with Tap(settings, EVENTS_EXCHANGE, key) as tap:
        await replicas.commit(key)
        assert await keys_published(tap, within_s=1.0) == []  # nobody told the relay
        replicas.running.committed()
        assert await keys_published(tap, within_s=5.0) == [key]


async def test_another_replicas_commit_wakes_the_relay_by_notify(
    replicas: Replicas, settings: Settings
) -> None:
    key = f"relay.{uuid.uuid4().hex[:8]}.other"
    async with Tap(settings, EVENTS_EXCHANGE, key) as tap:
        await replicas.commit(key)
        replicas.other.committed()  # its own loop is not running: only its NOTIFY can help
        assert await keys_published(tap, within_s=5.0) == [key]


async def test_a_relay_ignores_its_own_notify_but_not_a_transactions(
    replicas: Replicas, settings: Settings
) -> None:
    key = f"relay.{uuid.uuid4().hex[:8]}.own"
    async with Tap(settings, EVENTS_EXCHANGE, key) as tap:
        await replicas.commit(key)
        await replicas.notify(replicas.running.origin)  # already woken in-process
        assert await keys_published(tap, within_s=1.0) == []
        await replicas.notify("")  # outbox.add_many's NOTIFY
        assert await keys_published(tap, within_s=5.0) == [key]


async def test_a_burst_of_commits_sends_few_notifies(replicas: Replicas) -> None:
    heard: list[str] = []
    async with replicas.pool.acquire() as listener:

        def hear(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            heard.append(str(payload))

        await listener.add_listener(NOTIFY_CHANNEL, hear)
        for _ in range(100):
            replicas.other.committed()
        await replicas.other.close()
        await asyncio.sleep(0.3)
        await listener.remove_listener(NOTIFY_CHANNEL, hear)
    assert 1 <= len(heard) <= 2
    assert set(heard) == {replicas.other.origin}


async def test_a_batch_sends_its_events_to_the_sockets_exchange_as_one_message(
    replicas: Replicas, settings: Settings
) -> None:
    keys = [f"relay.{uuid.uuid4().hex[:8]}.{n}" for n in range(3)]
    async with (
        Tap(settings, SOCKETS_EXCHANGE, "") as sockets,
        Tap(settings, EVENTS_EXCHANGE, *keys) as events,
    ):
        await replicas.commit(keys[0])
        await replicas.commit("bot.nobody", BOTS_EXCHANGE)  # not an event: not in the batch
        for key in keys[1:]:
            await replicas.commit(key)
        replicas.running.committed()
        batches = await sockets.collect(lambda got: bool(got), within_s=5.0)
        assert batches == [[{"key": key} for key in keys]]  # one message, in outbox order
        published = await events.collect(lambda got: len(got) >= len(keys), within_s=5.0)
        assert [body["key"] for body in published] == keys  # and each event on its own


async def test_published_rows_are_deleted_after_their_retention(replicas: Replicas) -> None:
    now = [0.0]
    relay = replicas.make(retention_s=100.0, clock=lambda: now[0])
    async with replicas.pool.acquire() as conn:
        await replicas.commit("relay.a")
        await replicas.commit("relay.b")
        assert await relay.relay_once(conn) == 2  # at 0
        a, b = sorted(await replicas.ids())
        # b as a row committed late, after a higher id went out: not published yet
        await conn.execute("UPDATE outbox SET published_at = NULL WHERE id = $1", b)
        now[0] = 10.0
        await replicas.commit("relay.c")
        assert await relay.relay_once(conn) == 2  # b and c, at 10
        (c,) = set(await replicas.ids()) - {a, b}
        await conn.execute("UPDATE outbox SET published_at = NULL WHERE id = $1", b)
        now[0] = 99.0
        assert await relay.prune(conn) == 0  # nothing is 100 s old yet
        now[0] = 105.0
        assert await relay.prune(conn) == 1
        assert await replicas.ids() == {b: False, c: True}  # b kept: unpublished
        now[0] = 111.0
        assert await relay.prune(conn) == 1
        assert await replicas.ids() == {b: False}
        assert await relay.relay_once(conn) == 1  # b goes out at last
        assert await replicas.ids() == {b: True}
        now[0] = 212.0
        assert await relay.prune(conn) == 1
    assert await replicas.ids() == {}
    (counted,) = (
        sample.value
        for metric in relay.metrics.pruned.collect()
        for sample in metric.samples
        if sample.name == "gin_outbox_pruned_total"
    )
    assert counted == 3


async def test_a_running_relay_prunes_what_it_published(
    replicas: Replicas, settings: Settings
) -> None:
    relay = replicas.make(retention_s=0.5, poll_s=0.1)
    task = asyncio.create_task(relay.run())
    key = f"relay.{uuid.uuid4().hex[:8]}.pruned"
    try:
        async with Tap(settings, EVENTS_EXCHANGE, key) as tap:
            await replicas.commit(key)
            relay.wake.set()  # this relay only (committed() would wake the fixture's by NOTIFY)
            assert await keys_published(tap, within_s=5.0) == [key]
        for _ in range(50):
            if not await replicas.ids():
                break
            await asyncio.sleep(0.1)
        assert await replicas.ids() == {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_relay_woken_as_it_is_cancelled_still_stops(replicas: Replicas) -> None:
    """Cancelled in the very turn a commit wakes it (as at shutdown, right after a move), the
    relay stops. Python 3.11's asyncio.wait_for returned the wake-up and dropped the
    cancellation: the relay went on polling, and the app's cleanup waited for it for good."""
    relay = replicas.make(poll_s=POLL_S)
    task = asyncio.create_task(relay.run())
    await asyncio.sleep(0.3)  # past its first look: waiting to be woken
    assert not task.done()
    # committed()'s in-process wake-up (without its NOTIFY), in the turn of the cancel
    stopped = await stops_when_cancelled(task, just_before=relay.wake.set)
    assert stopped, "the relay did not stop when cancelled"


async def test_a_closed_relay_sends_no_more_notifies(replicas: Replicas) -> None:
    """A command consumer may finish a command after the app closed its relay: that commit
    starts no NOTIFY task, which nothing would wait for before the pool closes."""
    heard: list[str] = []
    async with replicas.pool.acquire() as listener:

        def hear(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            heard.append(str(payload))

        await listener.add_listener(NOTIFY_CHANNEL, hear)
        await replicas.other.close()
        replicas.other.committed()
        await asyncio.sleep(0.3)
        await listener.remove_listener(NOTIFY_CHANNEL, hear)
    assert heard == []


async def test_a_relay_that_takes_the_lock_as_another_lets_go_does_not_publish_again(
    replicas: Replicas, settings: Settings
) -> None:
    """Relay B asks for the lock while relay A holds it, and gets it the moment A has
    published its batch and committed: B must read the outbox as it is then, A's rows
    marked. (B read the batch in the statement that took the lock, with the snapshot that
    statement began with, from before A's commit, and published A's batch a second time.)

    The interleaving is forced: B's connection finds a ``pg_try_advisory_xact_lock`` of the
    schema first, which waits at a gate the test holds before it asks PostgreSQL's."""
    gate = 424242
    async with replicas.pool.acquire() as conn:
        await conn.execute(
            "CREATE FUNCTION pg_try_advisory_xact_lock(key bigint) RETURNS boolean"
            " LANGUAGE plpgsql AS $$ BEGIN"
            f" PERFORM pg_catalog.pg_advisory_xact_lock_shared({gate});"
            " RETURN pg_catalog.pg_try_advisory_xact_lock(key); END $$"
        )
    a, b = replicas.make(), replicas.make()
    keys = [f"relay.{uuid.uuid4().hex[:8]}.{n}" for n in range(3)]
    gatekeeper = await asyncpg.connect(settings.database_url)
    conn_a = await asyncpg.connect(
        settings.database_url, server_settings={"search_path": replicas.schema}
    )
    conn_b = await asyncpg.connect(
        settings.database_url, server_settings={"search_path": f"{replicas.schema}, pg_catalog"}
    )
    try:
        async with Tap(settings, EVENTS_EXCHANGE, *keys) as tap:
            for key in keys:
                await replicas.commit(key)
            await gatekeeper.execute("SELECT pg_advisory_lock($1)", gate)
            b_turn = asyncio.create_task(b.relay_once(conn_b))
            b_pid = conn_b.get_server_pid()
            for _ in range(200):  # until B's statement has begun and waits at the gate
                waiting = await gatekeeper.fetchval(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", b_pid
                )
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting, "relay B never reached the gate"
            assert await a.relay_once(conn_a) == len(keys)  # A publishes, marks, commits
            await gatekeeper.execute("SELECT pg_advisory_unlock($1)", gate)
            assert await asyncio.wait_for(b_turn, 5.0) == 0  # B: the lock, and nothing to do
            published = await tap.drain(quiet=0.5)
        assert [body["key"] for body in published] == keys  # once each
        assert all((await replicas.ids()).values())
    finally:
        for conn in (gatekeeper, conn_a, conn_b):
            await conn.close()


async def test_a_relay_whose_cancellation_was_swallowed_stops_at_its_next_turn(
    replicas: Replicas,
) -> None:
    """Something the relay awaits swallows its cancellation: it stops before its next look."""
    relay = replicas.make(poll_s=0.05)
    turns = 0

    async def swallowing(_conn: object) -> int:
        nonlocal turns
        turns += 1
        if turns > 1:  # (a later cancellation goes through: a failure ends, not hangs)
            await asyncio.sleep(60)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)
        return 0

    relay.relay_once = swallowing  # type: ignore[method-assign]
    task = asyncio.create_task(relay.run())
    stopped = await stops_when_cancelled(task, lambda: turns > 0)
    assert stopped, "the relay went on after its cancellation was swallowed"
    assert turns == 1


async def test_a_relay_whose_cancellation_turned_into_an_error_does_not_retry(
    replicas: Replicas,
) -> None:
    """Cancelled mid-batch on a connection that is gone, the rollback fails and its error
    replaces the cancellation: the relay stops instead of retrying for good."""
    relay = replicas.make(poll_s=0.05)
    turns = 0

    async def failing_as_it_unwinds(_conn: object) -> int:
        nonlocal turns
        turns += 1
        if turns > 1:
            await asyncio.sleep(60)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise ConnectionResetError("the connection went away during the rollback") from None
        return 0

    relay.relay_once = failing_as_it_unwinds  # type: ignore[method-assign]
    task = asyncio.create_task(relay.run())
    assert await stops_when_cancelled(task, lambda: turns > 0), "it retried after the cancel"
    assert turns == 1


async def test_a_traced_rows_message_carries_its_publish_span_an_untraced_rows_none(
    replicas: Replicas, settings: Settings
) -> None:
    """Issue 34: the row keeps the traceparent of the work that wrote it; the relay's publish
    is that work's child, and the message's header names the publish."""
    traced, plain = (f"relay.{uuid.uuid4().hex[:8]}.{kind}" for kind in ("traced", "plain"))
    exporter = InMemorySpanExporter()
    tracing.start("test", exporter=exporter, sampler=ALWAYS_ON)
    try:
        async with Tap(settings, EVENTS_EXCHANGE, traced, plain) as tap:
            with tracing.span("a move"):
                parent = tracing.traceparent()
                async with replicas.pool.acquire() as conn:
                    row = (EVENTS_EXCHANGE, traced, b'{"key": "%s"}' % traced.encode(), traced)
                    await outbox.add_many(conn, [row])
            await replicas.commit(plain)
            replicas.running.committed()
            got = [await tap.take(5.0) for _ in range(2)]
    finally:
        tracing.stop()
    by_key = {m.routing_key: m for m in got if m is not None}
    assert set(by_key) == {traced, plain}
    assert parent is not None
    publish = next(s for s in exporter.get_finished_spans() if s.kind == SpanKind.PRODUCER)
    assert publish.parent is not None
    assert f"{publish.parent.span_id:016x}" == parent.split("-")[2]
    header = by_key[traced].headers["traceparent"]
    header = header.decode() if isinstance(header, bytes) else header
    version, trace_id, span_id, flags = header.split("-")
    assert (version, trace_id) == ("00", parent.split("-")[1])
    assert span_id == f"{publish.context.span_id:016x}"
    assert int(flags, 16) & 1  # sampled
    assert "traceparent" not in (by_key[plain].headers or {})
