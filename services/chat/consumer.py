"""Who sits where, and which tables closed, learned from the table service's events.

The chat's own durable queue ``<prefix>gin.chat`` on ``gin.events`` keeps the table events
while the chat service is down, and the chat goes on working while the table service is down.
Idempotent: each event's ``(table_id, seq)`` is recorded in the same transaction as the change
it causes, and a repeat changes nothing. A ``player_erased`` (LGPD art. 18) deletes that
seat's person's messages at the table and puts the pseudonym in the seat, in that transaction;
the ``message_posted`` events already published are the broker's (its history stream keeps
them its retention) and each subscriber's to erase. Messages are applied one at a time, in the
order they come, by the shared runner (``shared.infra.consumer``): an undecodable message is
dead-lettered, an event type of a newer contract skipped, and a database outage holds the
message until it is applied.

The queue keeps only what was published after it was first declared: the chat service starts
(and declares it) before the table service takes its first table in a new deployment.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection
from prometheus_client import CollectorRegistry, Counter

from services.chat import store
from shared.contracts.envelope import Envelope
from shared.contracts.events import PlayerErased, SeatTaken, TableClosed, TableExpired
from shared.contracts.names import CHAT_QUEUE, EVENTS_EXCHANGE, table_event_key
from shared.infra.amqp import work_queue_arguments
from shared.infra.consumer import (
    Consumer,
    ConsumerMetrics,
    decode_event,
    event_context,
    in_transaction,
)
from shared.infra.db import Conn

log = structlog.get_logger()
LEARNED_FROM = ("seat_taken", "table_closed", "table_expired", "player_erased")
Outcome = Literal["applied", "duplicate", "ignored"]


async def declare_queue(channel: AbstractChannel, prefix: str) -> AbstractQueue:
    """The chat's durable queue, bound to the table events it learns from (idempotent)."""
    exchange = await channel.get_exchange(prefix + EVENTS_EXCHANGE)
    queue = await channel.declare_queue(
        prefix + CHAT_QUEUE,
        durable=True,
        arguments=work_queue_arguments(prefix),
    )
    for event_type in LEARNED_FROM:
        await queue.bind(exchange, table_event_key("*", event_type))
    return queue


async def apply_event(conn: Conn, envelope: Envelope) -> Outcome:
    """Apply one table event in the caller's transaction, once."""
    event = envelope.data
    if not isinstance(event, SeatTaken | TableClosed | TableExpired | PlayerErased):
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
        case PlayerErased(seat=seat, player=pseudonym):
            await store.erase_seat(conn, envelope.table_id, seat, pseudonym)
    if envelope.version is not None:
        await store.saw_version(conn, envelope.table_id, envelope.version)
    return "applied"


class TableEventConsumer:
    """Consumes the chat's queue, one event at a time in delivery order, until ``stop``."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        prefix: str,
        registry: CollectorRegistry,
        metrics: ConsumerMetrics,
    ) -> None:
        self.prefix = prefix
        self.channel: AbstractChannel | None = None
        self.events = Counter(
            "gin_chat_table_events",
            "Table events consumed by the chat, by type and outcome",
            ["type", "outcome"],
            registry=registry,
        )
        self.runner = Consumer(
            "chat_table_events",
            decode_event,
            in_transaction(pool, apply_event, self.applied),
            metrics,
            context=event_context,
            serial=True,
        )

    async def start(self, connection: AbstractRobustConnection, prefetch: int = 64) -> None:
        """Declare the queue and start consuming."""
        self.channel = await connection.channel()
        await self.channel.set_qos(prefetch_count=prefetch)
        await self.runner.start([await declare_queue(self.channel, self.prefix)])

    async def stop(self) -> None:
        """Stop taking messages, let the one in hand finish, close the channel (the broker
        gives back whatever was delivered and not acknowledged)."""
        await self.runner.stop()
        if self.channel is not None:
            with contextlib.suppress(Exception):
                await self.channel.close()

    def applied(self, envelope: Envelope, outcome: Outcome) -> None:
        """Count and log one event applied (committed)."""
        self.events.labels(envelope.type, outcome).inc()
        log.info("table_event_consumed", outcome=outcome)
