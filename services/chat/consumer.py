"""Who sits where, and which tables closed, learned from the table service's events.

The chat's own durable queue ``<prefix>gin.chat`` on ``gin.events`` keeps the table events
while the chat service is down, and the chat goes on working while the table service is down.
Idempotent: each event's ``(table_id, seq)`` is recorded in the same transaction as the change
it causes, and a repeat changes nothing. Messages are applied one at a time, in the order they
come. An undecodable message is dead-lettered; a database outage puts the message back.

The queue keeps only what was published after it was first declared: the chat service starts
(and declares it) before the table service takes its first table in a new deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

import asyncpg
import msgspec
import structlog
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from prometheus_client import CollectorRegistry, Counter

from services.chat import store
from shared.contracts.envelope import Envelope, envelope_decoder
from shared.contracts.events import SeatTaken, TableClosed, TableExpired
from shared.contracts.names import DEAD_LETTER, EVENTS_EXCHANGE, table_event_key
from shared.infra import db
from shared.infra.db import Conn

log = structlog.get_logger()
CHAT_QUEUE = "gin.chat"
LEARNED_FROM = ("seat_taken", "table_closed", "table_expired")
RETRY_PAUSE_S = 1.0
Outcome = Literal["applied", "duplicate", "ignored"]


async def declare_queue(channel: AbstractChannel, prefix: str) -> AbstractQueue:
    """The chat's durable queue, bound to the table events it learns from (idempotent)."""
    exchange = await channel.get_exchange(prefix + EVENTS_EXCHANGE)
    queue = await channel.declare_queue(
        prefix + CHAT_QUEUE,
        durable=True,
        arguments={"x-queue-type": "quorum", "x-dead-letter-exchange": prefix + DEAD_LETTER},
    )
    for event_type in LEARNED_FROM:
        await queue.bind(exchange, table_event_key("*", event_type))
    return queue


async def apply_event(conn: Conn, envelope: Envelope) -> Outcome:
    """Apply one table event in the caller's transaction, once."""
    event = envelope.data
    if not isinstance(event, SeatTaken | TableClosed | TableExpired):
        return "ignored"
    if not await store.track(conn, envelope.table_id, envelope.seq, envelope.type):
        return "duplicate"
    match event:
        case SeatTaken(seat=seat, player=player):
            await store.take_seat(conn, envelope.table_id, seat, player)
        case TableClosed(reason=reason):
            status: store.TableStatus = "expired" if reason == "expired" else "closed"
            await store.close_table(conn, envelope.table_id, status)
        case TableExpired():
            await store.close_table(conn, envelope.table_id, "expired")
    return "applied"


class TableEventConsumer:
    """Consumes the chat's queue until ``stop``."""

    def __init__(self, pool: asyncpg.Pool, prefix: str, registry: CollectorRegistry) -> None:
        self.pool = pool
        self.prefix = prefix
        self.lock = asyncio.Lock()  # one message at a time, in delivery order
        self.stopping = False
        self.channel: AbstractChannel | None = None
        self.queue: AbstractQueue | None = None
        self.consumer_tag: str | None = None
        self.events = Counter(
            "gin_chat_table_events",
            "Table events consumed by the chat, by type and outcome",
            ["type", "outcome"],
            registry=registry,
        )

    async def start(self, connection: AbstractRobustConnection, prefetch: int = 64) -> None:
        """Declare the queue and start consuming."""
        self.channel = await connection.channel()
        await self.channel.set_qos(prefetch_count=prefetch)
        self.queue = await declare_queue(self.channel, self.prefix)
        self.consumer_tag = await self.queue.consume(self.on_message)

    async def stop(self) -> None:
        """Stop taking messages, let the one in hand finish, close the channel (the broker
        gives back whatever was delivered and not acknowledged)."""
        self.stopping = True
        if self.queue is not None and self.consumer_tag is not None:
            with contextlib.suppress(Exception):  # the broker may be away; closing will do
                await self.queue.cancel(self.consumer_tag)
        async with self.lock:
            pass
        if self.channel is not None:
            with contextlib.suppress(Exception):
                await self.channel.close()

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Apply one table event, then settle the message."""
        # The client runs each delivery as its own task; the lock (FIFO) keeps their order.
        async with self.lock:
            if self.stopping:
                return
            await self._handle(message)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        try:
            envelope = envelope_decoder.decode(message.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("table_event_undecodable", error=str(exc))
            await message.reject(requeue=False)
            return
        structlog.contextvars.bind_contextvars(table_id=envelope.table_id)
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                outcome = await apply_event(conn, envelope)
        except Exception as exc:
            if db.transient(exc):  # the database is busy or away: retry, never dead-letter
                log.warning("table_event_retry", error=repr(exc))
                await asyncio.sleep(RETRY_PAUSE_S)
                await message.nack(requeue=True)
                return
            log.exception("table_event_failed", type=envelope.type, seq=envelope.seq)
            await message.reject(requeue=False)
            return
        finally:
            structlog.contextvars.unbind_contextvars("table_id")
        self.events.labels(envelope.type, outcome).inc()
        log.info("table_event_consumed", type=envelope.type, seq=envelope.seq, outcome=outcome)
        await message.ack()
