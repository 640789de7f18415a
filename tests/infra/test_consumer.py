"""The one consumer runner (``shared.infra.consumer``, issue 14 part 1), on a real RabbitMQ and
PostgreSQL: refused is acknowledged, transient is retried and never dead-lettered, undecodable
and failed are dead-lettered with a log line, an unknown event type is skipped; serial
delivery keeps the order through a retry, concurrent delivery runs messages side by side."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import aio_pika
import asyncpg
import msgspec
import pytest
from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection
from prometheus_client import CollectorRegistry
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from shared.contracts.envelope import wrap
from shared.contracts.events import UpcardPassed
from shared.infra import db
from shared.infra.consumer import (
    Consumer,
    ConsumerMetrics,
    decode_event,
    event_context,
    in_transaction,
    transient,
)
from shared.infra.settings import Settings


class Note(msgspec.Struct, frozen=True):
    n: int
    table_id: str = "t1"


class NotYours(Exception):
    code = "not_yours"


@dataclass
class Queues:
    connection: AbstractRobustConnection
    channel: AbstractChannel
    work: AbstractQueue
    dead: AbstractQueue

    async def publish(self, *bodies: bytes) -> None:
        for body in bodies:
            await self.channel.default_exchange.publish(
                aio_pika.Message(body), routing_key=self.work.name
            )

    async def dead_bodies(self, within_s: float = 5.0, count: int = 1) -> list[bytes]:
        found: list[bytes] = []
        deadline = time.monotonic() + within_s
        while len(found) < count and time.monotonic() < deadline:
            message = await self.dead.get(fail=False)
            if message is None:
                await asyncio.sleep(0.05)
                continue
            await message.ack()
            found.append(message.body)
        return found

    async def waiting(self) -> int:
        declared = await self.work.declare()
        return int(declared.message_count or 0)


@pytest.fixture
async def queues(settings: Settings) -> AsyncIterator[Queues]:
    name = f"{settings.prefix}consumer-test-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect_robust(settings.amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.set_qos(prefetch_count=16)
    dead_exchange = await channel.declare_exchange(name + ".dead", aio_pika.ExchangeType.FANOUT)
    dead = await channel.declare_queue(name + ".dead")
    await dead.bind(dead_exchange)
    work = await channel.declare_queue(name, arguments={"x-dead-letter-exchange": name + ".dead"})
    try:
        yield Queues(connection, channel, work, dead)
    finally:
        cleanup = await connection.channel()
        await cleanup.queue_delete(name)
        await cleanup.queue_delete(name + ".dead")
        await cleanup.exchange_delete(name + ".dead")
        await connection.close()


def read_note(body: bytes) -> Note:
    """Untyped first, as the contracts' lenient decoders read (JSON nested 5000 deep is a
    RecursionError there, not a DecodeError)."""
    return msgspec.convert(msgspec.json.decode(body), Note)


def runner(
    work: Callable[[Note], Awaitable[None]], serial: bool = False
) -> tuple[Consumer[Note], ConsumerMetrics]:
    metrics = ConsumerMetrics(CollectorRegistry())
    consumer = Consumer(
        "test",
        read_note,
        work,
        metrics,
        context=lambda note: {"table_id": note.table_id, "n": note.n},
        refused=(NotYours,),
        serial=serial,
    )
    return consumer, metrics


def count(metrics: ConsumerMetrics, outcome: str) -> float:
    return metrics.messages.labels("test", outcome)._value.get()


async def until(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


def note(n: int) -> bytes:
    return msgspec.json.encode(Note(n))


async def test_refused_is_acknowledged_and_failed_or_undecodable_is_dead_lettered(
    queues: Queues,
) -> None:
    done: list[int] = []

    async def work(value: Note) -> None:
        if value.n == 1:
            raise NotYours("a stale move")
        if value.n == 2:
            raise ValueError("a bug")
        done.append(value.n)

    consumer, metrics = runner(work)
    with capture_logs(processors=[merge_contextvars]) as logs:
        await consumer.start([queues.work])
        await queues.publish(
            note(1), note(2), b"not json", b'{"n": "x"}', b"[" * 5000 + b"]" * 5000, note(3)
        )
        await until(
            lambda: sum(count(metrics, o) for o in ("handled", "refused", "dead_lettered")) == 6
        )
        await consumer.stop()
    assert done == [3]
    assert count(metrics, "refused") == 1
    assert count(metrics, "handled") == 1
    assert metrics.dead_lettered.labels("test", "failed")._value.get() == 1
    assert metrics.dead_lettered.labels("test", "undecodable")._value.get() == 3
    assert sorted(await queues.dead_bodies(count=4)) == sorted(
        [note(2), b"not json", b'{"n": "x"}', b"[" * 5000 + b"]" * 5000]
    )
    assert await queues.waiting() == 0
    events = [
        (e["event"], e.get("table_id"), e.get("n")) for e in logs if e["log_level"] != "debug"
    ]
    assert ("message_refused", "t1", 1) in events
    assert ("message_failed", "t1", 2) in events
    assert next(e for e in logs if e["event"] == "message_undecodable")["consumer"] == "test"
    assert len([e for e in logs if e["event"] == "message_undecodable"]) == 3
    failed = next(e for e in logs if e["event"] == "message_failed")
    assert "exc_info" in failed  # the traceback goes with it


async def test_a_terminated_database_connection_is_retried_never_dead_lettered(
    queues: Queues, settings: Settings
) -> None:
    """pg_terminate_backend is what a fast PostgreSQL shutdown does to every session
    (SQLSTATE 57P01, which the consumers used to dead-letter)."""
    pool = await db.create_pool(settings.database_url, "public", 2)
    admin = await asyncpg.connect(settings.database_url)
    tries: dict[int, int] = {}
    errors: list[BaseException] = []

    async def apply(conn: db.Conn, value: Note) -> int:
        tries[value.n] = tries.get(value.n, 0) + 1
        if tries[value.n] <= 2:  # twice, each time the session is killed mid-transaction
            await admin.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        try:
            return int(await conn.fetchval("SELECT $1::int", value.n))
        except Exception as exc:
            errors.append(exc)
            raise

    applied: list[int] = []
    try:
        consumer, metrics = runner(in_transaction(pool, apply, lambda _, r: applied.append(r)))
        await consumer.start([queues.work])
        await queues.publish(note(7))
        await until(lambda: count(metrics, "handled") == 1)
        await consumer.stop()
    finally:
        await admin.close()
        pool.terminate()
    assert applied == [7]
    assert tries == {7: 3}
    assert metrics.retries.labels("test")._value.get() == 2
    assert all(transient(e) for e in errors), errors
    assert await queues.dead_bodies(within_s=0.3) == []


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        asyncpg.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.SerializationError("could not serialize access"),
        asyncpg.DeadlockDetectedError("deadlock detected"),
        TimeoutError(),
        ConnectionResetError(),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.InternalClientError(
            "cannot switch to state 11; another operation (2) is in progress"
        ),
    ],
    ids=lambda e: type(e).__name__,
)
def test_what_is_transient(error: BaseException) -> None:
    assert transient(error)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.UniqueViolationError("dup"),
        asyncpg.UndefinedTableError("x"),
        asyncpg.InternalClientError("unexpected exchange"),
        ValueError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_what_is_not_transient(error: BaseException) -> None:
    assert not transient(error)


async def test_serial_delivery_keeps_the_order_through_a_retry(queues: Queues) -> None:
    seen: list[int] = []
    order: list[int] = []

    async def work(value: Note) -> None:
        seen.append(value.n)
        if seen.count(1) < 3 and value.n == 1:
            raise ConnectionResetError("the database went away")
        order.append(value.n)

    consumer, metrics = runner(work, serial=True)
    await consumer.start([queues.work])
    await queues.publish(*(note(n) for n in range(1, 8)))
    await until(lambda: count(metrics, "handled") == 7)
    await consumer.stop()
    assert order == list(range(1, 8))
    assert seen[:3] == [1, 1, 1]  # nothing overtook the one held


async def test_concurrent_delivery_works_side_by_side(queues: Queues) -> None:
    together = asyncio.Barrier(4)

    async def work(value: Note) -> None:
        async with asyncio.timeout(5):  # only if all four are in hand at once
            await together.wait()

    consumer, metrics = runner(work)
    await consumer.start([queues.work])
    await queues.publish(*(note(n) for n in range(4)))
    await until(lambda: count(metrics, "handled") == 4)
    await consumer.stop()
    assert count(metrics, "dead_lettered") == 0


async def test_stopped_while_retrying_the_message_goes_back_to_its_queue(
    queues: Queues,
) -> None:
    async def away(value: Note) -> None:
        raise ConnectionResetError("the database is away")

    consumer, metrics = runner(away, serial=True)
    await consumer.start([queues.work])
    await queues.publish(note(5))
    await until(lambda: metrics.retries.labels("test")._value.get() >= 1)
    started = time.monotonic()
    await consumer.stop()
    assert time.monotonic() - started < 2  # the retry let go at once
    await queues.channel.close()  # what was in hand goes back
    channel = await queues.connection.channel()
    queue = await channel.get_queue(queues.work.name)
    again = await queue.get(fail=False, timeout=5)
    assert again is not None
    assert again.body == note(5)
    await again.ack()
    assert count(metrics, "dead_lettered") == 0


async def test_an_event_type_of_a_newer_contract_is_skipped_not_dead_lettered(
    queues: Queues,
) -> None:
    now = time.time()
    known = msgspec.json.encode(wrap("t9", 1, UpcardPassed(hand=1, seat=0), datetime.now(UTC)))
    newer = known.replace(b"upcard_passed", b"card_juggled")
    handled: list[str] = []

    async def work(envelope: object) -> None:
        handled.append(type(envelope).__name__)

    metrics = ConsumerMetrics(CollectorRegistry())
    consumer = Consumer("events", decode_event, work, metrics, context=event_context, serial=True)
    with capture_logs() as logs:
        await consumer.start([queues.work])
        await queues.publish(newer, known, b'{"id": 1}')
        await until(lambda: metrics.messages.labels("events", "handled")._value.get() == 1)
        await until(lambda: metrics.dead_lettered.labels("events", "undecodable")._value.get() == 1)
        await consumer.stop()
    assert handled == ["Envelope"]
    assert metrics.messages.labels("events", "skipped")._value.get() == 1
    skipped = next(e for e in logs if e["event"] == "message_skipped")
    assert "card_juggled" in skipped["reason"]
    assert await queues.dead_bodies() == [b'{"id": 1}']
    assert time.time() - now < 30


async def test_messages_of_a_closed_channel_are_left_to_their_redelivery(queues: Queues) -> None:
    """Serial delivery: messages already delivered when the channel closed come again, in
    order, on the next channel; working them now would apply them before the one in hand."""
    release = asyncio.Event()
    worked: list[int] = []

    async def work(value: Note) -> None:
        worked.append(value.n)
        if value.n == 1:
            await release.wait()

    consumer, metrics = runner(work, serial=True)
    await consumer.start([queues.work])
    await queues.publish(note(1), note(2), note(3))
    await until(lambda: worked == [1] and consumer.inbox.qsize() == 2)
    await queues.channel.close()  # the broker takes back all three
    release.set()
    await until(lambda: consumer.idle)
    await consumer.stop()
    assert worked == [1]
    channel = await queues.connection.channel()
    declared = await channel.declare_queue(queues.work.name, passive=True)
    assert declared.declaration_result.message_count == 3
    assert count(metrics, "dead_lettered") == 0
