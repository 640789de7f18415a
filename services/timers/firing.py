"""Firing due deadlines: any number of replicas, each deadline once.

A replica takes due rows with ``FOR UPDATE SKIP LOCKED`` and, in the same transaction, marks
them fired and writes what they cause to the service's outbox; the shared relay publishes it
with publisher confirms. So a firing is committed once (a row another replica holds is
skipped, and a fired row is no longer due), nothing fires that is not recorded, and nothing
recorded is left unpublished (at least once, like every outbox message; the message ids and
the expire ``command_id`` are fixed per deadline, so a repeat is recognised). The due time
is compared with the injected clock, never the database's, so a deadline that passed while
every replica was down fires as soon as one is back.

- absence: ``absence_claimable`` on ``gin.events``, key ``timer.<table_id>.absence_claimable``,
  once per decision. Its envelope is of the table's ``timer`` stream: ``seq`` is the next
  number of that stream (``store.next_announcement``, in the firing transaction), and
  ``data.table_seq`` the table event that gave the seat the decision (the ``since`` moment);
  its ``id`` is derived from table and that table seq.
- expiry: ``QueuedCommand(source="timer", command=Expire(...))`` to ``gin.commands``. The
  table service checks it against its own times. Until the table reports its expiry (or
  another move), the command is sent again after ``timer_retry_s``, doubling, a few times:
  a table whose clock is behind this one's refuses the first and accepts a later one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec
import structlog

from services.timers import store
from services.timers.metrics import TimerMetrics
from services.timers.store import Due, Fired
from shared.contracts.api import QueuedCommand
from shared.contracts.commands import Expire
from shared.contracts.envelope import Envelope
from shared.contracts.events import AbsenceClaimable
from shared.contracts.names import COMMANDS_EXCHANGE, COMMANDS_QUEUE, EVENTS_EXCHANGE, timer_key
from shared.infra import outbox
from shared.infra.db import Conn

log = structlog.get_logger()
_json = msgspec.json.Encoder()
# Rows written before gin.commands.in existed name the default exchange: the relay sends them
# through gin.commands.in too (the timers' broker user may not write the default exchange).
DEFAULT_EXCHANGE = ""
ID_NAMESPACE = uuid.UUID("0d5c4c52-5b1c-4f4e-9a51-6a3c2f0e7b10")  # absence_claimable ids
MAX_EXPIRY_ATTEMPTS = 8
BUSY_PAUSE_S = 0.05  # due rows another replica holds: look again shortly
PENDING_EVERY_S = 1.0
CATCH_UP_MAX_S = 30.0
ERROR_BACKOFF_MAX_S = 5.0

OutboxRow = tuple[str, str, bytes, str]


def at(timestamp: float) -> datetime:
    """A clock reading as an aware UTC datetime."""
    return datetime.fromtimestamp(timestamp, UTC)


def absence_claimable(due: Due, now: datetime, number: int) -> OutboxRow:
    """The outbox row announcing that the seat to act is absent (R10.2), the table's
    ``number``-th ``timer`` event."""
    deadline = due.deadline
    assert deadline.seat is not None
    envelope = Envelope(
        id=uuid.uuid5(ID_NAMESPACE, f"{due.table_id}:absence:{deadline.seq}"),
        type="absence_claimable",
        table_id=due.table_id,
        stream="timer",
        seq=number,
        occurred_at=now,
        data=AbsenceClaimable(
            seat=deadline.seat, since=deadline.since.astimezone(UTC), table_seq=deadline.seq
        ),
    )
    key = timer_key(due.table_id, "absence_claimable")
    return EVENTS_EXCHANGE, key, _json.encode(envelope), str(envelope.id)


def expire_command_id(table_id: str, seq: int) -> str:
    """The expire command's id: one per deadline (the last move's seq), the same on resends."""
    return f"timer:expire:{table_id}:{seq}"


def expire_command(due: Due, prefix: str) -> OutboxRow:
    """The outbox row asking the table service to expire an idle table (R10.3)."""
    command_id = expire_command_id(due.table_id, due.deadline.seq)
    body = QueuedCommand(
        table_id=due.table_id, source="timer", command=Expire(command_id=command_id)
    )
    key = prefix + COMMANDS_QUEUE
    return COMMANDS_EXCHANGE, key, _json.encode(body), f"{command_id}:{due.attempts}"


class Firing:
    """Fires this service's due deadlines. ``run`` until cancelled."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        prefix: str,
        clock: Callable[[], float],
        metrics: TimerMetrics,
        *,
        batch: int = 100,
        poll_s: float = 1.0,
        retry_s: float = 600.0,
    ) -> None:
        self.pool = pool
        self.prefix = prefix
        self.clock = clock
        self.metrics = metrics
        self.batch = batch
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.woken = asyncio.Event()
        self.pending_counted_at = -PENDING_EVERY_S

    def wake(self) -> None:
        """Look again now: a deadline changed, maybe to an earlier time."""
        self.woken.set()

    async def run(self, catch_up: Callable[[], Awaitable[None]] | None = None) -> None:
        """Fire due deadlines until cancelled; survive database outages.

        ``catch_up`` returns once the events queued while no replica ran are applied: this
        replica starts firing then (or after ``CATCH_UP_MAX_S`` at most).
        """
        if catch_up is not None:
            await self._wait_for(catch_up)
        backoff = 0.1
        while True:
            self.woken.clear()
            try:
                pause = await self.step()
                backoff = 0.1
            except Exception as exc:
                log.warning("timer_firing_failed", error=repr(exc), retry_in_s=backoff)
                pause, backoff = backoff, min(backoff * 2, ERROR_BACKOFF_MAX_S)
            if pause > 0:  # asyncio.timeout: 3.11's wait_for can drop a cancellation
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self.woken.wait()

    async def _wait_for(self, catch_up: Callable[[], Awaitable[None]]) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(CATCH_UP_MAX_S):
                await catch_up()
        except Exception as exc:  # fire anyway: late is worse than a stale announcement
            log.warning("timer_catch_up_incomplete", error=repr(exc))
        log.info("timer_firing_started", catch_up_s=round(time.monotonic() - started, 3))

    async def step(self) -> float:
        """Fire one batch; how long to wait before the next."""
        fired = await self.fire_due()
        await self._count_pending()
        if fired >= self.batch:
            return 0.0
        async with self.pool.acquire() as conn:
            next_at = await store.next_due(conn)
        if next_at is None:
            return self.poll_s
        until = (next_at - at(self.clock())).total_seconds()
        if until <= 0:  # due, yet not taken: another replica holds it
            return min(self.poll_s, BUSY_PAUSE_S)
        return min(self.poll_s, until)

    async def fire_due(self) -> int:
        """Take the deadlines due now (skipping those another replica holds) and fire them,
        in one transaction; how many fired."""
        now = at(self.clock())
        async with self.pool.acquire() as conn, conn.transaction():
            taken = await store.take_due(conn, now, self.batch)
            if not taken:
                return 0
            await outbox.add_many(conn, [await self._message(conn, due, now) for due in taken])
            await store.mark_fired(conn, [self._fired(due, now) for due in taken], now)
        for due in taken:
            self._report(due, now)
        return len(taken)

    async def _message(self, conn: Conn, due: Due, now: datetime) -> OutboxRow:
        if due.deadline.kind == "absence":
            return absence_claimable(due, now, await store.next_announcement(conn, due.table_id))
        return expire_command(due, self.prefix)

    def _fired(self, due: Due, now: datetime) -> Fired:
        kind = due.deadline.kind
        again: datetime | None = None
        if kind == "expiry" and due.attempts + 1 < MAX_EXPIRY_ATTEMPTS:
            again = now + timedelta(seconds=self.retry_s * 2**due.attempts)
        return Fired(table_id=due.table_id, kind=kind, next_at=again)

    def _report(self, due: Due, now: datetime) -> None:
        deadline = due.deadline
        lag = (now - deadline.due_at).total_seconds()
        if due.attempts == 0:
            self.metrics.fired.labels(deadline.kind).inc()
            self.metrics.lag.labels(deadline.kind).observe(lag)
        else:
            self.metrics.resent.inc()
        log.info(
            "deadline_fired",
            table_id=due.table_id,
            kind=deadline.kind,
            seat=deadline.seat,
            seq=deadline.seq,
            due_at=deadline.due_at.isoformat(),
            lag_s=round(lag, 3),
            attempt=due.attempts + 1,
            command_id=(
                expire_command_id(due.table_id, deadline.seq) if deadline.kind == "expiry" else None
            ),
        )
        if deadline.kind == "expiry" and due.attempts + 1 >= MAX_EXPIRY_ATTEMPTS:
            log.warning("expiry_unanswered", table_id=due.table_id, attempts=due.attempts + 1)

    async def _count_pending(self) -> None:
        if time.monotonic() - self.pending_counted_at < PENDING_EVERY_S:
            return
        self.pending_counted_at = time.monotonic()
        async with self.pool.acquire() as conn:
            counts = await store.pending(conn)
        for kind, n in counts.items():
            self.metrics.pending.labels(kind).set(n)
