"""The outbox relay: publishes committed outbox rows with publisher confirms, in order.

Woken by NOTIFY, with a polling fallback. One relay publishes at a time (a transaction-level
advisory lock), so any number of replicas run it without duplicating or reordering a table's
events; a row is marked published only after the broker confirmed it. While the broker is
down nothing is marked, and the rows go out, in order, once it is back (at least once).

A process that commits rows often (the table service) tells its own relay in-process
(``committed``) and sends one NOTIFY after the commit for every burst of commits, so that
whichever replica holds the lock wakes too. A NOTIFY inside each move's transaction would
serialize every commit behind PostgreSQL's notify queue lock and cost a wake-up per move.

Published rows are kept ``retention_s`` (to look into), then deleted: the outbox is a way out,
not a log (each service keeps its own log; the table's is ``events``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from pamqp.commands import Basic
from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra import tracing
from shared.infra.amqp import Outgoing, publish_confirmed
from shared.infra.db import Conn

log = structlog.get_logger()
SQL_DIR = Path(__file__).parent / "sql"
NOTIFY_CHANNEL = "gin_outbox"
PERSISTENT = 2  # delivery mode
TRANSIENT = 1
PUBLISH_TIMEOUT_S = 10.0  # a broker that neither confirms nor fails: give up, retry the batch
# How long a batch may hold the relay's lock. The server ends the session of a batch idle in
# its transaction this long (its lock with it: a relay cut off from the database by a network
# that drops its packets would hold it for good), and the relay drops such a connection too.
LOCK_HOLD_S = PUBLISH_TIMEOUT_S + 5.0
PRUNE_EVERY_S = 60.0  # at most; more often when the retention is shorter


async def add_many(conn: Conn, rows: list[tuple[str, str, bytes, str]]) -> None:
    """Append messages (exchange, routing key, body, message id) and wake the relay; each
    row keeps the current span's ``traceparent`` (none when tracing is off)."""
    if not rows:
        return
    parent = tracing.traceparent()
    await conn.executemany(
        "INSERT INTO outbox (exchange, routing_key, body, message_id, traceparent)"
        " VALUES ($1, $2, $3, $4, $5)",
        [(*row, parent) for row in rows],
    )
    await conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")


class RelayMetrics:
    """What the relay reports on /metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter(
            "gin_outbox_published", "Outbox messages published", registry=registry
        )
        self.lag = Gauge(
            "gin_outbox_lag_seconds",
            "Age of the oldest unpublished outbox message when the relay last looked",
            registry=registry,
        )
        self.failures = Counter(
            "gin_outbox_publish_failures", "Relay batches that failed to publish", registry=registry
        )
        self.pruned = Counter(
            "gin_outbox_pruned",
            "Published outbox messages deleted after their retention",
            registry=registry,
        )


# The relay lock, then the oldest unpublished rows, each in a statement of its own: in READ
# COMMITTED a statement reads with the snapshot it began with, so a statement that took the
# lock too could read from before the lock came free, when the relay that had held it had not
# yet committed its marks, and publish that relay's batch a second time.
_TAKE_LOCK = f"""
SELECT pg_try_advisory_xact_lock($1) FROM
(SELECT set_config('idle_in_transaction_session_timeout', '{int(LOCK_HOLD_S * 1000)}', true)) _
"""
_TAKE_BATCH = """
SELECT now() AS now, id, exchange, routing_key, body, message_id, created_at, traceparent
FROM outbox
WHERE published_at IS NULL ORDER BY id LIMIT $1
"""


class OutboxRelay:
    """Publishes one schema's outbox. ``run`` until cancelled."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        schema: str,
        channel: AbstractChannel,
        exchanges: Mapping[str, AbstractExchange],
        metrics: RelayMetrics,
        batch: int = 500,
        poll_s: float = 1.0,
        linger_s: float = 0.02,
        digest_to: str | None = None,
        retention_s: float = 86400.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``digest_to`` names an exchange that also gets each batch's events (its rows for
        ``gin.events``) as one message, a JSON array of their bodies, confirmed with the
        rest of the batch. Rows this relay published are deleted ``retention_s`` later."""
        self.pool = pool
        self.channel = channel  # with publisher confirms
        self.exchanges = {key: exchange.name for key, exchange in exchanges.items()}
        self.metrics = metrics
        self.batch = batch
        self.poll_s = poll_s
        self.linger_s = linger_s
        self.digest_to = None if digest_to is None else self.exchanges[digest_to]
        self.lock_key = zlib.crc32(f"relay:{schema}".encode())
        self.wake = asyncio.Event()
        self.origin = uuid.uuid4().hex  # this relay's NOTIFY payload: it ignores its own
        self._notify_due = False
        self._notifier: asyncio.Task[None] | None = None
        self._closed = False
        # A batch failed or timed out on ``channel``: open it anew before the next publish.
        self._renew = False
        self.retention_s = retention_s
        self.clock = clock
        # (when, highest id published by then), a mark per ``_mark_s`` at most, oldest first
        self._published: deque[tuple[float, int]] = deque()
        self._mark_s = min(1.0, retention_s / 10)
        self._prune_every_s = min(PRUNE_EVERY_S, retention_s)
        self._prune_at = clock() + self._prune_every_s

    async def run(self) -> None:
        """Relay until cancelled; survive database and broker outages."""
        backoff = 0.1
        while True:
            try:
                # One connection of its own, to listen and to publish: a relay that queued for
                # the pool behind a busy service's commands fell ever further behind at saturation.
                async with self.pool.acquire() as conn:
                    await conn.add_listener(NOTIFY_CHANNEL, self._notified)
                    backoff = 0.1
                    try:
                        await self._loop(conn)
                    finally:
                        # A lost connection (a failover) is already back in the pool: its
                        # error, not this one, says what happened.
                        with contextlib.suppress(asyncpg.InterfaceError):
                            await conn.remove_listener(NOTIFY_CHANNEL, self._notified)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if _stopping():  # a cleanup's error (a lost connection's) replaced the cancel
                    raise asyncio.CancelledError from exc
                self.metrics.failures.inc()
                log.warning("outbox_relay_failed", error=repr(exc), retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _notified(self, _conn: Conn, _pid: int, _channel: str, payload: object) -> None:
        if payload != self.origin:
            self.wake.set()

    def committed(self) -> None:
        """This process committed outbox rows: wake this relay now, and the other replicas'
        relays (one of them may hold the lock) with one NOTIFY for all commits meanwhile."""
        self.wake.set()
        if self._closed:  # shutting down: nothing would wait for the NOTIFY's task
            return
        self._notify_due = True
        if self._notifier is None or self._notifier.done():
            self._notifier = asyncio.get_running_loop().create_task(self._notify_others())

    async def _notify_others(self) -> None:
        while self._notify_due:
            self._notify_due = False
            try:
                async with self.pool.acquire() as conn:
                    await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, self.origin)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("outbox_notify_failed", error=repr(exc))  # the others poll
                return

    async def close(self) -> None:
        """Wait for a NOTIFY still being sent; send no more (the pool closes next)."""
        self._closed = True
        if self._notifier is not None:
            with contextlib.suppress(Exception):
                await self._notifier

    async def _loop(self, conn: Conn) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if _stopping():  # cancelled, though something on the way swallowed it
                raise asyncio.CancelledError
            self.wake.clear()
            began = loop.time()
            # A batch that holds the lock too long is on a connection that no longer answers
            # (the database's server ends that session, and frees the lock, as long after):
            # drop it, and take the lock again on a new one.
            watchdog = loop.call_later(LOCK_HOLD_S, conn.terminate)
            try:
                sent = await self.relay_once(conn)
            finally:
                watchdog.cancel()
            if sent >= self.batch:
                continue
            if self.clock() >= self._prune_at:
                await self.prune(conn)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns a wake-up that
            # came in the same turn as a cancellation and drops the cancellation, and the
            # relay, cancelled at shutdown, polled on while the app waited for it to end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self.wake.wait()
            if sent:  # busy: let the next batch gather for ``linger_s`` after this one began
                await asyncio.sleep(began + self.linger_s - loop.time())

    async def relay_once(self, conn: Conn) -> int:
        """Publish one batch if this relay holds the lock; how many were published."""
        async with conn.transaction():
            if not await conn.fetchval(_TAKE_LOCK, self.lock_key):
                return 0
            rows = await conn.fetch(_TAKE_BATCH, self.batch)
            if not rows:
                self.metrics.lag.set(0)
                return 0
            oldest: datetime = rows[0]["created_at"]
            self.metrics.lag.set((rows[0]["now"] - oldest).total_seconds())
            # One channel, one write: the order holds, the confirms are awaited together.
            spans = (
                [
                    tracing.publishing(r["exchange"], r["routing_key"], r["traceparent"])
                    for r in rows
                ]
                if tracing.on()
                else [None] * len(rows)
            )
            messages = [
                Outgoing(
                    self.exchanges[row["exchange"]],
                    row["routing_key"],
                    row["body"],
                    Basic.Properties(
                        message_id=row["message_id"],
                        content_type="application/json",
                        delivery_mode=PERSISTENT,
                        headers=tracing.header_of(span, row["traceparent"]),
                    ),
                )
                for row, span in zip(rows, spans, strict=True)
            ]
            if self.digest_to is not None:
                messages += _digest(self.digest_to, rows)
            try:
                await self._publish(messages)
            except BaseException as exc:
                tracing.published(spans, exc)
                raise
            tracing.published(spans)
            await conn.execute(
                "UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])",
                [row["id"] for row in rows],
            )
        self.metrics.published.inc(len(rows))
        self._mark(rows[-1]["id"])
        return len(rows)

    async def _publish(self, messages: list[Outgoing]) -> None:
        """Publish a batch with confirms on a channel that has not failed one.

        A batch that failed or timed out leaves its channel suspect: after a stream's leader
        stopped, RabbitMQ 3.10 went on confirming a channel's publishes to the stream that
        it no longer stored (rabbitmq-server#9457: the channel keeps its route to the old
        stream writer). The relay then opens the channel anew (a new channel process on the
        broker) before the batch is tried again; its rows were not marked, so they go out
        again, at least once."""
        if self._renew:
            async with asyncio.timeout(PUBLISH_TIMEOUT_S):  # a blocked connection answers late
                await _reopen(self.channel)
            self._renew = False
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                await publish_confirmed(await self.channel.get_underlay_channel(), messages)
        except Exception:
            self._renew = True
            raise

    def _mark(self, upto: int) -> None:
        """Rows up to id ``upto`` (those of them published) were published by now."""
        now = self.clock()
        if self._published and now - self._published[-1][0] < self._mark_s:
            self._published[-1] = (self._published[-1][0], max(upto, self._published[-1][1]))
        else:
            self._published.append((now, upto))

    async def prune(self, conn: Conn) -> int:
        """Delete the rows this relay published ``retention_s`` ago or earlier (and any older
        published row, a former relay's); how many. A row committed late with a lower id
        than those is kept until it is published."""
        now = self.clock()
        self._prune_at = now + self._prune_every_s
        cutoff = now - self.retention_s
        upto = None
        while self._published and self._published[0][0] <= cutoff:
            upto = self._published.popleft()[1]
        if upto is None:
            return 0
        status = await conn.execute(
            "DELETE FROM outbox WHERE id <= $1 AND published_at IS NOT NULL", upto
        )
        deleted = int(status.split()[-1])
        self.metrics.pruned.inc(deleted)
        return deleted


def _stopping() -> bool:
    """Whether this task was asked to stop, even if the CancelledError never reached it (a
    library swallowed it) or an error raised while it unwound (a rollback on a lost
    connection) took its place: the relay then stops instead of retrying for good."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _reopen(channel: AbstractChannel) -> None:
    """Close a channel and open it again: the same object, a new channel on the broker.
    The close may fail (the connection is away); the open raises then, and is tried again."""
    with contextlib.suppress(Exception):
        await channel.close()
    await channel.reopen()
    log.info("outbox_relay_channel_reopened")


def _digest(exchange: str, rows: list[asyncpg.Record]) -> list[Outgoing]:
    """A batch's events (its rows for ``gin.events``) as one message, a JSON array of their
    bodies; none for a batch without events."""
    events = [row["body"] for row in rows if row["exchange"] == EVENTS_EXCHANGE]
    if not events:
        return []
    body = b"[" + b",".join(events) + b"]"
    properties = Basic.Properties(content_type="application/json", delivery_mode=TRANSIENT)
    return [Outgoing(exchange, "", body, properties)]
