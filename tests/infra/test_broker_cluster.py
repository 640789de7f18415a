"""The services' broker client through the loss of RabbitMQ nodes (issue 28), on a real
three-node cluster (``chaos/rabbits.py``, started once for the module).

``amqp.connect`` given every node's address connects to one, and when that node stops it moves
to a live one: publishing with confirms and consuming go on, and nothing the broker confirmed
is lost, while the node it was on (and that led the queue) is stopped and started again. The
services' topology is replicated on every node, a connection's exclusive queue (the table hub's
``gin.sockets.<hex>``) comes back on the new node, and a history stream reader resumes from
the offset it last processed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import msgspec
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from prometheus_client import CollectorRegistry

from chaos.rabbits import RabbitCluster
from shared.contracts.envelope import SCHEMA_VERSION
from shared.contracts.names import COMMANDS_QUEUE, DEAD_LETTER, EVENTS_EXCHANGE, HISTORY_STREAM
from shared.infra import amqp, db, outbox
from shared.infra.outbox import SQL_DIR, OutboxRelay, RelayMetrics
from shared.infra.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitCluster]:
    """Three nodes for the module (some 14 s to start, 5 s to stop, on 2 cores)."""
    began = time.monotonic()
    cluster = RabbitCluster(ROOT / ".run" / f"broker-cluster-{uuid.uuid4().hex[:8]}")
    print(f"cluster of 3 started in {time.monotonic() - began:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def from_the_first_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """``amqp.connect`` starts at the first node given (not a random one): the tests know
    which node a client is on before they stop it."""
    monkeypatch.setattr(amqp.random, "randrange", lambda _n: 0)


@pytest.fixture
async def connections() -> AsyncIterator[list[AbstractRobustConnection]]:
    """Connections a test made (closed after it)."""
    made: list[AbstractRobustConnection] = []
    yield made
    for connection in made:
        with contextlib.suppress(Exception):
            await connection.close()


def node_of(cluster: RabbitCluster, connection: AbstractRobustConnection) -> str:
    """The node a connection is on (or trying to reach)."""
    assert isinstance(connection, aio_pika.RobustConnection)
    port = connection.url.port
    assert port is not None
    return cluster.node_of_port(port)


async def until(condition: Any, within_s: float, what: str) -> float:
    """Wait for ``condition()`` to be true; the seconds it took."""
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < within_s, f"{what}: not within {within_s} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - began


class Publisher:
    """Publishes numbered messages with confirms, one at a time; a publish that fails or
    whose confirm never comes is tried again (as the outbox relay does: nothing is marked
    before its confirm)."""

    def __init__(self, connection: AbstractRobustConnection, queue: str) -> None:
        self.connection = connection
        self.queue = queue
        self.confirmed: list[int] = []
        self.failures = 0
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        channel = await self.connection.channel(publisher_confirms=True)
        number = 0
        while True:
            try:
                async with asyncio.timeout(5):
                    await channel.default_exchange.publish(
                        aio_pika.Message(str(number).encode(), delivery_mode=2), self.queue
                    )
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures += 1
                await asyncio.sleep(0.1)
                continue  # the same number again
            self.confirmed.append(number)
            number += 1

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def test_the_services_url_names_every_node(cluster: RabbitCluster) -> None:
    assert amqp.node_urls(cluster.url) == cluster.urls
    assert amqp.node_urls(cluster.urls[0]) == [cluster.urls[0]]
    assert "guest:***@" in amqp.redacted(cluster.url)
    assert "guest@" not in amqp.redacted(cluster.url)


async def unpublished(pool: Any) -> int:
    """The outbox rows not yet published."""
    async with pool.acquire() as conn:
        n = await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
    return int(n)


async def test_the_topology_is_replicated_on_every_node(
    cluster: RabbitCluster, connections: list[AbstractRobustConnection]
) -> None:
    connections.append(await amqp.connect(cluster.url))
    channel = await connections[0].channel()
    prefix = f"topo{uuid.uuid4().hex[:6]}."
    await amqp.declare_topology(channel, prefix)
    try:
        queues = {row["name"]: row for row in cluster.queues()}
        for name in (COMMANDS_QUEUE, DEAD_LETTER, HISTORY_STREAM):
            row = queues[prefix + name]
            assert sorted(row["members"]) == cluster.names(), name  # type: ignore[arg-type]
    finally:
        await amqp.delete_topology(channel, prefix)


async def test_a_client_moves_to_a_live_node_and_nothing_confirmed_is_lost(
    cluster: RabbitCluster,
    connections: list[AbstractRobustConnection],
    from_the_first_node: None,
) -> None:
    publishing = await amqp.connect(cluster.url)
    consuming = await amqp.connect(cluster.url)
    connections += [publishing, consuming]
    first = node_of(cluster, publishing)
    assert node_of(cluster, consuming) == first == cluster.names()[0]

    channel = await consuming.channel()
    await channel.set_qos(prefetch_count=50)
    name = f"cluster.{uuid.uuid4().hex[:8]}"
    queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    assert cluster.leader_of(name) == first  # declared from there: led from there
    received: set[int] = set()

    async def on_message(message: AbstractIncomingMessage) -> None:
        received.add(int(message.body))
        await message.ack()

    await queue.consume(on_message)
    publisher = Publisher(publishing, name)
    publisher.start()
    try:
        await until(lambda: len(publisher.confirmed) > 100, 20, "publishing")
        for stopped in (first, cluster.names()[1]):
            node = node_of(cluster, publishing)
            assert node == stopped  # the node the clients are on
            before = len(publisher.confirmed)
            began = time.monotonic()
            await asyncio.to_thread(cluster.stop_node, stopped)
            moved = await until(
                lambda stopped=stopped, before=before: (
                    node_of(cluster, publishing) != stopped
                    and len(publisher.confirmed) > before + 50
                ),
                30,
                f"publishing again after {stopped} stopped",
            )
            print(f"{stopped} stopped: confirms again after {moved:.2f} s")
            new_leader = cluster.leader_of(name)
            assert new_leader != stopped
            await until(
                lambda before=before: max(received, default=-1) > before + 25,
                30,
                "consuming on the new node",
            )
            assert node_of(cluster, consuming) != stopped
            await asyncio.to_thread(cluster.start_node, stopped)
            print(f"{stopped} back in {time.monotonic() - began:.2f} s since its stop")
        await until(lambda: len(publisher.confirmed) > before + 150, 20, "publishing at the end")
    finally:
        await publisher.stop()
    confirmed = set(publisher.confirmed)
    await until(lambda: confirmed <= received, 30, "every confirmed message consumed")
    assert publisher.failures > 0  # the publishes in flight at each stop were tried again
    await channel.queue_delete(name)


async def test_an_exclusive_queue_comes_back_on_the_new_node(
    cluster: RabbitCluster,
    connections: list[AbstractRobustConnection],
    from_the_first_node: None,
) -> None:
    """As the table hub's gin.sockets.<hex>: declared by its robust channel, it dies with the
    node and is declared again (with its bindings) on the node the connection moves to, and
    ``reconnect_callbacks`` tell the hub to consume again and catch up."""
    connection = await amqp.connect(cluster.url)
    other = await amqp.connect(cluster.url)
    connections += [connection, other]
    reconnected = asyncio.Event()
    connection.reconnect_callbacks.add(lambda *_: reconnected.set())
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        f"cluster.x.{uuid.uuid4().hex[:8]}", aio_pika.ExchangeType.FANOUT, auto_delete=True
    )
    queue = await channel.declare_queue(
        f"cluster.sockets.{uuid.uuid4().hex}", exclusive=True, auto_delete=True
    )
    await queue.bind(exchange)
    got: list[bytes] = []

    async def on_message(message: AbstractIncomingMessage) -> None:
        got.append(message.body)

    await queue.consume(on_message, no_ack=True)
    stopped = node_of(cluster, connection)
    await asyncio.to_thread(cluster.stop_node, stopped)
    try:
        async with asyncio.timeout(30):
            await reconnected.wait()
        assert node_of(cluster, connection) != stopped
        # Published from a connection of its own (moved too, or on a live node already).
        sending = await other.channel()
        target = await sending.get_exchange(exchange.name)
        await until(lambda: node_of(cluster, other) != stopped, 30, "the sender moved")
        await target.publish(aio_pika.Message(b"after"), "")
        await until(lambda: got == [b"after"], 10, "a delivery on the queue declared again")
    finally:
        await asyncio.to_thread(cluster.start_node, stopped)


def stock_low(table_id: str, seq: int) -> bytes:
    """A table event's envelope (any event does: the reader prints each once)."""
    return msgspec.json.encode(
        {
            "id": str(uuid.uuid4()),
            "type": "stock_low",
            "table_id": table_id,
            "stream": "table",
            "seq": seq,
            "occurred_at": "2026-12-05T12:00:00Z",
            "schema_version": SCHEMA_VERSION,
            "data": {"type": "stock_low", "hand": 1, "stock_count": 4},
        }
    )


async def test_a_history_reader_resumes_from_its_last_offset(
    cluster: RabbitCluster,
    connections: list[AbstractRobustConnection],
    from_the_first_node: None,
) -> None:
    """examples/subscriber.py (docs/subscribing.md's advice) reading the history stream from
    "next", on the node that leads the stream: that node stops while events keep coming, and
    the reader, on the next node, goes on from the offset after the last it processed, so
    nothing published meanwhile is missed (a consumer made again with "next" would miss it)."""
    prefix = f"hist{uuid.uuid4().hex[:6]}."
    declaring = await amqp.connect(cluster.url)
    connections.append(declaring)
    channel = await declaring.channel()
    await amqp.declare_topology(channel, prefix, "chat")
    first = cluster.names()[0]
    assert cluster.leader_of(prefix + HISTORY_STREAM) == first
    publishing = await aio_pika.connect_robust(cluster.urls[2])  # a node that stays
    connections.append(publishing)
    events = await (await publishing.channel()).get_exchange(prefix + EVENTS_EXCHANGE)
    table_id = uuid.uuid4().hex

    async def publish(seq: int) -> None:
        while True:  # a stream without a leader yet refuses or times out: again
            try:
                async with asyncio.timeout(5):
                    await events.publish(
                        aio_pika.Message(stock_low(table_id, seq)), f"table.{table_id}.stock_low"
                    )
                return
            except Exception:
                await asyncio.sleep(0.2)

    reader = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "subscriber.py"),
        "--idle-exit",
        "6",
        cwd=ROOT,
        env={**os.environ, "GIN_AMQP_URL": cluster.url, "GIN_PREFIX": prefix},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert reader.stdout is not None
    printed: list[int] = []

    async def read_until(seq: int) -> None:
        assert reader.stdout is not None
        async with asyncio.timeout(40):
            while not printed or printed[-1] < seq:
                line = await reader.stdout.readline()
                if not line:
                    assert reader.stderr is not None
                    error = (await reader.stderr.read()).decode()
                    raise AssertionError(f"the reader exited: {error}")
                printed.append(msgspec.json.decode(line)["seq"])

    try:
        async with asyncio.timeout(30):  # until it reads: it starts at "next"
            while reader.stdout.at_eof() is False and not printed:
                await publish(1)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        line = await reader.stdout.readline()
                        printed.append(msgspec.json.decode(line)["seq"])
        for seq in range(2, 101):
            await publish(seq)
        await read_until(100)
        await asyncio.to_thread(cluster.stop_node, first)
        for seq in range(101, 201):
            await publish(seq)
        await read_until(200)
        await asyncio.to_thread(cluster.start_node, first)
        async with asyncio.timeout(30):
            rest, err = await reader.communicate()
    finally:
        if reader.returncode is None:
            reader.kill()
            await reader.wait()
    printed += [msgspec.json.decode(line)["seq"] for line in rest.splitlines()]
    assert printed == list(range(1, 201))
    assert b"resuming on the next node" in err
    await amqp.delete_topology(channel, prefix)


async def test_the_outbox_relay_loses_no_committed_row_when_its_node_goes(
    cluster: RabbitCluster,
    connections: list[AbstractRobustConnection],
    from_the_first_node: None,
    settings: Settings,
) -> None:
    """The services' relay (``publish_confirmed`` on a robust channel) on the node leading the
    queue its events reach: rows committed before, during and after that node's stop are all
    marked published, and every one of them reaches the queue (a batch whose confirms never
    came was rolled back and published again, on the node the connection moved to)."""
    schema = f"relay_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(settings.database_url)
    try:
        await db.migrate(conn, schema, SQL_DIR)
    finally:
        await conn.close()
    pool = await db.create_pool(settings.database_url, schema, 4)
    prefix = f"relay{uuid.uuid4().hex[:6]}."
    publishing = await amqp.connect(cluster.url)
    connections.append(publishing)
    channel = await publishing.channel(publisher_confirms=True)
    exchanges = await amqp.declare_topology(channel, prefix, "chat")
    name = prefix + "relayed"
    queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    await queue.bind(exchanges[EVENTS_EXCHANGE], "#")
    stopped = node_of(cluster, publishing)
    assert cluster.leader_of(name) == stopped
    consuming = await aio_pika.connect_robust(cluster.urls[2])  # a node that stays
    connections.append(consuming)
    received: set[int] = set()

    async def on_message(message: AbstractIncomingMessage) -> None:
        received.add(int(msgspec.json.decode(message.body)["n"]))
        await message.ack()

    await (await (await consuming.channel()).get_queue(name)).consume(on_message)
    registry = CollectorRegistry()
    relay = OutboxRelay(pool, schema, channel, exchanges, RelayMetrics(registry), poll_s=0.2)
    relaying = asyncio.create_task(relay.run())
    committed = 0

    async def commit(until_s: float) -> None:
        nonlocal committed
        deadline = time.monotonic() + until_s
        while time.monotonic() < deadline:
            async with pool.acquire() as conn:
                rows = [
                    (
                        EVENTS_EXCHANGE,
                        f"relay.{committed + i}",
                        b'{"n": %d}' % (committed + i),
                        uuid.uuid4().hex,
                    )
                    for i in range(5)
                ]
                await outbox.add_many(conn, rows)
            committed += 5
            relay.committed()
            await asyncio.sleep(0.02)

    try:
        await commit(2)
        await asyncio.to_thread(cluster.stop_node, stopped)
        await commit(3)
        await asyncio.to_thread(cluster.start_node, stopped)
        await commit(1)

        async with asyncio.timeout(30):
            while await unpublished(pool):
                await asyncio.sleep(0.1)
        await until(lambda: len(received) == committed, 30, "every committed row consumed")
        assert received == set(range(committed))
        assert node_of(cluster, publishing) != stopped
        failures = registry.get_sample_value("gin_outbox_publish_failures_total")
        print(f"{committed} rows, {failures} failed batches tried again")
    finally:
        relaying.cancel()
        await asyncio.gather(relaying, return_exceptions=True)
        await channel.queue_delete(name)
        await amqp.delete_topology(channel, prefix)
        async with pool.acquire() as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await pool.close()


async def read_stream(connection: AbstractRobustConnection, stream: str) -> set[int]:
    """The ``n`` of every message in a stream, read from its first offset until it is idle."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=500)
    queue = await channel.get_queue(stream, ensure=False)
    seen: set[int] = set()
    last = time.monotonic()

    async def on_message(message: AbstractIncomingMessage) -> None:
        nonlocal last
        last = time.monotonic()
        with contextlib.suppress(Exception):
            seen.add(int(msgspec.json.decode(message.body)["n"]))
        await message.ack()

    await queue.consume(on_message, arguments={"x-stream-offset": "first"})
    await until(lambda: time.monotonic() - last > 3, 60, "the stream read to its end")
    await channel.close()
    return seen


async def test_the_relay_loses_no_stream_event_when_the_streams_leader_goes(
    cluster: RabbitCluster,
    connections: list[AbstractRobustConnection],
    from_the_first_node: None,
    settings: Settings,
) -> None:
    """The relay on a node that stays up, the history stream led by another that stops while
    rows are committed: every committed row is in the stream once that node is back. A batch
    that failed or timed out meanwhile is published again on a channel opened anew
    (rabbitmq-server#9457: the old channel's publishes to the stream were confirmed, not
    stored, after its leader's failover)."""
    schema = f"relay_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(settings.database_url)
    try:
        await db.migrate(conn, schema, SQL_DIR)
    finally:
        await conn.close()
    pool = await db.create_pool(settings.database_url, schema, 4)
    prefix = f"strm{uuid.uuid4().hex[:6]}."
    declaring = await amqp.connect(cluster.url)  # the first node: the stream's leader
    connections.append(declaring)
    await amqp.declare_topology(await declaring.channel(), prefix, "chat")
    stream = prefix + HISTORY_STREAM
    leader = cluster.names()[0]
    assert cluster.leader_of(stream) == leader
    publishing = await amqp.connect(cluster.urls[2])  # a node that stays
    connections.append(publishing)
    channel = await publishing.channel(publisher_confirms=True)
    exchanges = await amqp.declare_topology(channel, prefix, "chat")
    registry = CollectorRegistry()
    relay = OutboxRelay(pool, schema, channel, exchanges, RelayMetrics(registry), poll_s=0.2)
    channels = {id(await channel.get_underlay_channel())}
    relaying = asyncio.create_task(relay.run())
    committed = 0

    async def commit(until_s: float) -> None:
        nonlocal committed
        deadline = time.monotonic() + until_s
        while time.monotonic() < deadline:
            async with pool.acquire() as conn:
                rows = [
                    (EVENTS_EXCHANGE, f"relay.{n}", b'{"n": %d}' % n, uuid.uuid4().hex)
                    for n in range(committed, committed + 5)
                ]
                await outbox.add_many(conn, rows)
            committed += 5
            relay.committed()
            with contextlib.suppress(Exception):
                channels.add(id(await channel.get_underlay_channel()))
            await asyncio.sleep(0.02)

    try:
        await commit(2)
        await asyncio.to_thread(cluster.stop_node, leader)
        await commit(4)
        await asyncio.to_thread(cluster.start_node, leader)
        await commit(1)

        async with asyncio.timeout(60):
            while await unpublished(pool):
                await asyncio.sleep(0.1)
                with contextlib.suppress(Exception):
                    channels.add(id(await channel.get_underlay_channel()))
        failures = registry.get_sample_value("gin_outbox_publish_failures_total") or 0
        print(f"{committed} rows, {failures} failed batches, {len(channels)} channels")
        reading = await aio_pika.connect_robust(cluster.urls[1])
        connections.append(reading)
        stored = await read_stream(reading, stream)
        assert set(range(committed)) - stored == set()
        if failures:
            assert len(channels) > 1, "a failed batch was tried again on the same channel"
    finally:
        relaying.cancel()
        await asyncio.gather(relaying, return_exceptions=True)
        with contextlib.suppress(Exception):
            await amqp.delete_topology(await declaring.channel(), prefix)
        async with pool.acquire() as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await pool.close()


async def test_the_relay_publishes_on_a_new_channel_after_a_timed_out_batch(
    cluster: RabbitCluster,
    connections: list[AbstractRobustConnection],
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch whose confirms never came (the relay's node blocks publishers: a memory
    alarm) is published again, once the node takes them, on a channel opened anew, and every
    committed row reaches the stream."""
    monkeypatch.setattr(outbox, "PUBLISH_TIMEOUT_S", 1.0)
    schema = f"relay_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(settings.database_url)
    try:
        await db.migrate(conn, schema, SQL_DIR)
    finally:
        await conn.close()
    pool = await db.create_pool(settings.database_url, schema, 4)
    prefix = f"blk{uuid.uuid4().hex[:6]}."
    node = cluster.names()[2]
    publishing = await amqp.connect(cluster.urls[2])
    connections.append(publishing)
    channel = await publishing.channel(publisher_confirms=True)
    exchanges = await amqp.declare_topology(channel, prefix, "chat")
    registry = CollectorRegistry()
    relay = OutboxRelay(pool, schema, channel, exchanges, RelayMetrics(registry), poll_s=0.2)
    before = await channel.get_underlay_channel()
    relaying = asyncio.create_task(relay.run())
    rows = [(EVENTS_EXCHANGE, f"relay.{n}", b'{"n": %d}' % n, uuid.uuid4().hex) for n in range(20)]
    try:
        await asyncio.to_thread(cluster.ctl, node, "set_vm_memory_high_watermark", "0")
        async with pool.acquire() as conn:
            await outbox.add_many(conn, rows[:10])
        relay.committed()
        await until(
            lambda: registry.get_sample_value("gin_outbox_publish_failures_total"),
            30,
            "a batch timed out",
        )
        await asyncio.to_thread(cluster.ctl, node, "set_vm_memory_high_watermark", "0.4")
        async with pool.acquire() as conn:
            await outbox.add_many(conn, rows[10:])
        relay.committed()
        async with asyncio.timeout(30):
            while True:
                async with pool.acquire() as conn:
                    if not await conn.fetchval(
                        "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                    ):
                        break
                await asyncio.sleep(0.1)
        assert await channel.get_underlay_channel() is not before
        reading = await aio_pika.connect_robust(cluster.urls[1])
        connections.append(reading)
        assert await read_stream(reading, prefix + HISTORY_STREAM) == set(range(20))
    finally:
        await asyncio.to_thread(cluster.ctl, node, "set_vm_memory_high_watermark", "0.4")
        relaying.cancel()
        await asyncio.gather(relaying, return_exceptions=True)
        with contextlib.suppress(Exception):
            await amqp.delete_topology(channel, prefix)
        async with pool.acquire() as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await pool.close()
