"""Table events, consumed from the timer service's own queue, move the deadlines.

The queue (``<prefix>gin.timers``) is durable, so events published while the service is
down wait for it, and bound to ``gin.events`` with ``table.*.*``. It has a single active
consumer: one replica applies events, the others stand by, so a table's events are applied
in the order the outbox relay published them; this replica applies them one at a time. Each
event is applied in one transaction with the table's ``last_seq`` (``deadlines.after_event``
ignores a seq applied already), and acknowledged after the commit: at-least-once delivery,
exactly-once effect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aio_pika
import asyncpg
import structlog
from aio_pika.abc import AbstractQueue, AbstractRobustConnection

from services.timers import store
from services.timers.deadlines import Durations, Kind, after_event
from services.timers.metrics import TimerMetrics
from shared.contracts.envelope import Envelope
from shared.contracts.names import EVENTS_EXCHANGE, TIMERS_QUEUE
from shared.infra.amqp import work_queue_arguments
from shared.infra.consumer import (
    UNDECODABLE,
    Consumer,
    ConsumerMetrics,
    decode_event,
    event_context,
    in_transaction,
)
from shared.infra.db import Conn

log = structlog.get_logger()
TABLE_EVENTS = "table.*.*"
PREFETCH = 64
CATCH_UP_POLL_S = 0.05


class EventConsumer:
    """Applies table events to the deadlines, in order, once each."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        durations: Durations,
        prefix: str,
        metrics: TimerMetrics,
        on_change: Callable[[], None],
        consumer_metrics: ConsumerMetrics,
    ) -> None:
        self.durations = durations
        self.prefix = prefix
        self.metrics = metrics
        self.on_change = on_change
        self.queue: AbstractQueue | None = None
        # A database outage holds a message (and the ones after it) rather than putting it
        # back behind later events of its table.
        self.runner = Consumer(
            "timer_table_events",
            self.decode,
            in_transaction(pool, self.apply, self.applied),
            consumer_metrics,
            context=event_context,
            serial=True,
        )

    async def start(self, connection: AbstractRobustConnection) -> None:
        """Declare and bind the queue, then consume it."""
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        exchange = await channel.get_exchange(self.prefix + EVENTS_EXCHANGE)
        self.queue = await declare_queue(channel, self.prefix)
        await self.queue.bind(exchange, TABLE_EVENTS)
        await self.runner.start([self.queue])

    async def stop(self) -> None:
        """Stop consuming; unacknowledged messages go back to the queue for the next one."""
        await self.runner.stop()

    async def caught_up(self) -> None:
        """Return once no event is waiting: none queued in the broker, none here.

        The firing loop waits for this when a replica starts, so a deadline that a move made
        while the service was down replaced is replaced before it could fire.
        """
        assert self.queue is not None
        quiet = 0
        while quiet < 2:  # twice in a row: deliveries on their way have arrived meanwhile
            declared = await self.queue.declare()
            idle = declared.message_count == 0 and self.runner.idle
            quiet = quiet + 1 if idle else 0
            await asyncio.sleep(CATCH_UP_POLL_S)

    def decode(self, body: bytes) -> Envelope:
        """An event's envelope (counted as rejected when it is not one)."""
        try:
            return decode_event(body)
        except UNDECODABLE:
            self.metrics.events.labels("rejected").inc()
            raise

    def applied(self, envelope: Envelope, changed: list[Kind] | None) -> None:
        """Count one event applied (committed); wake the firing loop if a deadline moved."""
        self.metrics.events.labels("duplicate" if changed is None else "applied").inc()
        if changed:
            self.on_change()

    async def apply(self, conn: Conn, envelope: Envelope) -> list[Kind] | None:
        """Apply one event in the caller's transaction: the kinds of deadline set anew, or
        None when the event was applied before."""
        before = await store.lock_table(conn, envelope.table_id)
        after = after_event(before, envelope, self.durations)
        if after is None:
            log.debug("table_event_duplicate", last_seq=before.last_seq)
            return None
        if before.last_seq and envelope.seq != before.last_seq + 1:
            log.warning("table_event_gap", last_seq=before.last_seq)
        changed = await store.save_table(conn, envelope.table_id, before, after)
        log.debug("table_event_applied", changed=changed)
        return changed


async def declare_queue(channel: aio_pika.abc.AbstractChannel, prefix: str) -> AbstractQueue:
    """The timer service's durable queue of table events (idempotent)."""
    return await channel.declare_queue(
        prefix + TIMERS_QUEUE,
        durable=True,
        arguments={
            **work_queue_arguments(prefix),
            "x-single-active-consumer": True,
        },
    )
