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
import contextlib
from collections.abc import Awaitable, Callable

import aio_pika
import asyncpg
import msgspec
import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue, AbstractRobustConnection

from services.timers import store
from services.timers.deadlines import Durations, Kind, after_event
from services.timers.metrics import TimerMetrics
from shared.contracts.envelope import Envelope, envelope_decoder
from shared.contracts.names import DEAD_LETTER, EVENTS_EXCHANGE
from shared.infra import db

log = structlog.get_logger()
TIMERS_QUEUE = "gin.timers"
TABLE_EVENTS = "table.*.*"
PREFETCH = 64
RETRY_PAUSE_S = 1.0
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
    ) -> None:
        self.pool = pool
        self.durations = durations
        self.prefix = prefix
        self.metrics = metrics
        self.on_change = on_change
        self.inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self.queue: AbstractQueue | None = None
        self.consumer_tag: str | None = None
        self.worker: asyncio.Task[None] | None = None
        self.busy = False

    async def start(self, connection: AbstractRobustConnection) -> None:
        """Declare and bind the queue, then consume it."""
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        exchange = await channel.get_exchange(self.prefix + EVENTS_EXCHANGE)
        self.queue = await declare_queue(channel, self.prefix)
        await self.queue.bind(exchange, TABLE_EVENTS)
        self.worker = asyncio.create_task(self._work(), name="timer-events")
        # aio-pika runs each delivery's callback as its own task: the callback only queues
        # the message (in delivery order) and one worker applies them one after another.
        self.consumer_tag = await self.queue.consume(self._received)

    async def stop(self) -> None:
        """Stop consuming; unacknowledged messages go back to the queue for the next one."""
        if self.queue is not None and self.consumer_tag is not None:
            with contextlib.suppress(Exception):  # the broker may be away: nothing to cancel
                await self.queue.cancel(self.consumer_tag)
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker

    async def caught_up(self) -> None:
        """Return once no event is waiting: none queued in the broker, none here.

        The firing loop waits for this when a replica starts, so a deadline that a move made
        while the service was down replaced is replaced before it could fire.
        """
        assert self.queue is not None
        quiet = 0
        while quiet < 2:  # twice in a row: deliveries on their way have arrived meanwhile
            declared = await self.queue.declare()
            idle = declared.message_count == 0 and self.inbox.empty() and not self.busy
            quiet = quiet + 1 if idle else 0
            await asyncio.sleep(CATCH_UP_POLL_S)

    async def _received(self, message: AbstractIncomingMessage) -> None:
        self.inbox.put_nowait(message)

    async def _work(self) -> None:
        while True:
            message = await self.inbox.get()
            self.busy = True
            try:
                await self.handle(message)
            except Exception:  # never let one message stop the worker
                log.exception("table_event_worker_failed")
            finally:
                self.busy = False

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Apply one event, then settle its message."""
        try:
            envelope = envelope_decoder.decode(message.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("table_event_undecodable", error=str(exc))
            self.metrics.events.labels("rejected").inc()
            await _settle(message.reject(requeue=False))
            return
        structlog.contextvars.bind_contextvars(table_id=envelope.table_id)
        try:
            changed = await self._apply_until_done(envelope)
        except Exception:
            log.exception("table_event_failed", seq=envelope.seq, type=envelope.type)
            self.metrics.events.labels("rejected").inc()
            await _settle(message.reject(requeue=False))
            return
        finally:
            structlog.contextvars.unbind_contextvars("table_id")
        self.metrics.events.labels("duplicate" if changed is None else "applied").inc()
        await _settle(message.ack())
        if changed:
            self.on_change()

    async def _apply_until_done(self, envelope: Envelope) -> list[Kind] | None:
        # A database outage holds this message (and the ones after it) rather than putting it
        # back behind later events of its table.
        while True:
            try:
                return await self.apply(envelope)
            except Exception as exc:
                if not db.transient(exc):
                    raise
                log.warning("table_event_retry", error=repr(exc), retry_in_s=RETRY_PAUSE_S)
                await asyncio.sleep(RETRY_PAUSE_S)

    async def apply(self, envelope: Envelope) -> list[Kind] | None:
        """Apply one event in one transaction: the kinds of deadline set anew, or None when
        the event was applied before."""
        async with self.pool.acquire() as conn, conn.transaction():
            before = await store.lock_table(conn, envelope.table_id)
            after = after_event(before, envelope, self.durations)
            if after is None:
                log.debug("table_event_duplicate", seq=envelope.seq, last_seq=before.last_seq)
                return None
            if before.last_seq and envelope.seq != before.last_seq + 1:
                log.warning("table_event_gap", seq=envelope.seq, last_seq=before.last_seq)
            changed = await store.save_table(conn, envelope.table_id, before, after)
        log.debug("table_event_applied", seq=envelope.seq, type=envelope.type, changed=changed)
        return changed


async def declare_queue(channel: aio_pika.abc.AbstractChannel, prefix: str) -> AbstractQueue:
    """The timer service's durable queue of table events (idempotent)."""
    return await channel.declare_queue(
        prefix + TIMERS_QUEUE,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-single-active-consumer": True,
            "x-dead-letter-exchange": prefix + DEAD_LETTER,
        },
    )


async def _settle(settling: Awaitable[None]) -> None:
    """Ack or reject; a channel lost meanwhile means the broker redelivers, which is safe."""
    try:
        await settling
    except Exception as exc:
        log.warning("table_event_settle_failed", error=repr(exc))
