"""Firing due deadlines: any number of replicas, each deadline once.

The deadlines are the table service's, saved with each change of a table (``store``). A
replica looks for those of one kind that are due and not fired (``deadlines.window``) while
it holds that kind's ``scans`` row, and in the same transaction records them fired, moves the
scan on, and writes what they cause to the service's outbox; the shared relay publishes it
with publisher confirms. So a firing is committed once (one replica looks at a kind at a
time; a fired deadline is not looked at again), a replica killed mid-batch leaves nothing
behind (its transaction is rolled back: the next look fires the batch), nothing fires that
is not recorded, and nothing recorded is left unpublished (at least once, like every outbox
message; the message ids and the expire ``command_id`` are fixed per deadline, so a repeat
is recognised). A move saves its table's new deadlines in its own statement, so no deadline
a move has replaced can fire, whatever a replica missed while it was down. The due time is
compared with the injected clock, never the database's, so a deadline that passed while
every replica was down fires as soon as one is back. There is no work per move here: the
cost of the timers grows with the deadlines that fire, not with the moves.

- absence: ``absence_claimable`` on ``gin.events``, key ``timer.<table_id>.absence_claimable``,
  once per decision. Its envelope is of the table's ``timer`` stream: ``seq`` is the next
  number of that stream (``store.next_announcement``, in the firing transaction), and
  ``data.table_seq`` the table event that gave the seat the decision (the ``since`` moment);
  its ``id`` is derived from table and that table seq.
- reminders (issue 33): ``turn_reminder`` on ``gin.events``, key
  ``timer.<table_id>.turn_reminder``, a ``timer`` stream event like ``absence_claimable``:
  ``waiting`` once per decision at each offset of ``GIN_TURN_REMINDERS_S`` (a kind of its own,
  fired as the absence is), and ``claimable`` right after each ``absence_claimable``, in its
  transaction. A ``waiting`` reminder whose next one is due already is recorded, not sent.
  No reminder at all when ``GIN_TURN_REMINDERS_S`` is empty.
- expiry: ``QueuedCommand(source="timer", command=Expire(...))`` to ``gin.commands``. The
  table service checks it against its own times. Until the table reports its expiry (or
  another move), the command is sent again after ``timer_retry_s``, doubling, a few times:
  a table whose clock is behind this one's refuses the first and accepts a later one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec
import structlog

from services.timers import store
from services.timers.deadlines import (
    LOOK_BACK,
    Due,
    Durations,
    Kind,
    due_at,
    reminder_offset,
    window,
)
from services.timers.metrics import TimerMetrics
from services.timers.store import Fired
from shared.contracts.api import QueuedCommand
from shared.contracts.commands import Expire
from shared.contracts.envelope import Envelope
from shared.contracts.events import AbsenceClaimable, ReminderKind, TurnReminder
from shared.contracts.names import COMMANDS_EXCHANGE, COMMANDS_QUEUE, EVENTS_EXCHANGE, timer_key
from shared.infra import outbox, tracing
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
FORGET_EVERY_S = 60.0
UNREADABLE_RETRY_S = 0.5  # the table's deadlines not readable yet: look again this soon
UNREADABLE_WARN_S = 60.0
ERROR_BACKOFF_MAX_S = 5.0

OutboxRow = tuple[str, str, bytes, str]


def at(timestamp: float) -> datetime:
    """A clock reading as an aware UTC datetime."""
    return datetime.fromtimestamp(timestamp, UTC)


def absence_claimable(due: Due, now: datetime, number: int) -> OutboxRow:
    """The outbox row announcing that the seat to act is absent (R10.2), the table's
    ``number``-th ``timer`` event."""
    assert due.seat is not None
    data = AbsenceClaimable(seat=due.seat, since=due.since.astimezone(UTC), table_seq=due.seq)
    return _timer_event(due, now, number, "absence_claimable", f"absence:{due.seq}", data)


def turn_reminder(
    due: Due, now: datetime, number: int, durations: Durations, reminder: ReminderKind
) -> OutboxRow:
    """The outbox row reminding that the seat to act has had its decision for a while (at a
    reminder offset, or now that its absence is claimable), the table's ``number``-th
    ``timer`` event."""
    assert due.seat is not None
    since = due.since.astimezone(UTC)
    offset = reminder_offset(due.kind)
    after_s = durations.absence_after_s if offset is None else float(offset)
    name = "claimable" if reminder == "claimable" else str(offset)
    data = TurnReminder(
        seat=due.seat,
        since=since,
        waited_s=round((now - since).total_seconds(), 3),
        claimable_at=since + durations.of("absence"),
        reminder=reminder,
        after_s=after_s,
        table_seq=due.seq,
    )
    return _timer_event(due, now, number, "turn_reminder", f"reminder:{name}:{due.seq}", data)


def _timer_event(
    due: Due,
    now: datetime,
    number: int,
    event_type: str,
    name: str,
    data: AbsenceClaimable | TurnReminder,
) -> OutboxRow:
    """The outbox row of the table's ``number``-th ``timer`` event, on ``gin.events``; its id
    derived from the table and ``name``, so a refire of the same deadline keeps it."""
    envelope = Envelope(
        id=uuid.uuid5(ID_NAMESPACE, f"{due.table_id}:{name}"),
        type=event_type,
        table_id=due.table_id,
        stream="timer",
        seq=number,
        occurred_at=now,
        data=data,
    )
    key = timer_key(due.table_id, event_type)
    return EVENTS_EXCHANGE, key, _json.encode(envelope), str(envelope.id)


def expire_command_id(table_id: str, seq: int) -> str:
    """The expire command's id: one per deadline (the last move's seq), the same on resends."""
    return f"timer:expire:{table_id}:{seq}"


def expire_command(due: Due, prefix: str) -> OutboxRow:
    """The outbox row asking the table service to expire an idle table (R10.3)."""
    command_id = expire_command_id(due.table_id, due.seq)
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
        durations: Durations,
        *,
        batch: int = 100,
        poll_s: float = 1.0,
        retry_s: float = 600.0,
    ) -> None:
        self.pool = pool
        self.prefix = prefix
        self.clock = clock
        self.metrics = metrics
        self.durations = durations
        self.batch = batch
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.pending_counted_at = -PENDING_EVERY_S
        self.forgot_at = -FORGET_EVERY_S

    async def run(self) -> None:
        """Fire due deadlines until cancelled; survive database outages (and a table schema
        not made yet: the table service's migrations may run after this one's)."""
        await self._until_readable()
        log.info("timer_firing_started")
        backoff = 0.1
        while True:
            try:
                pause = await self.step()
                backoff = 0.1
            except Exception as exc:
                log.warning("timer_firing_failed", error=repr(exc), retry_in_s=backoff)
                pause, backoff = backoff, min(backoff * 2, ERROR_BACKOFF_MAX_S)
            if pause > 0:
                await asyncio.sleep(pause)

    async def _until_readable(self) -> None:
        """Wait until the table's deadlines can be read: on a new database the timers may
        start before the table service has migrated. Said once at info, then as a warning
        every minute past the first (a grant missing in production: deploy/README.md)."""
        started = time.monotonic()
        said_at: float | None = None
        while True:
            try:
                async with self.pool.acquire() as conn:
                    await store.readable(conn)
                    await store.add_scans(conn, self.durations.kinds)
                return
            except Exception as exc:
                waited = time.monotonic() - started
                if said_at is None or time.monotonic() - said_at >= UNREADABLE_WARN_S:
                    level = log.warning if said_at is not None else log.info
                    level("timer_waiting_for_table_deadlines", error=repr(exc), waited_s=waited)
                    said_at = time.monotonic()
            await asyncio.sleep(UNREADABLE_RETRY_S)

    async def step(self) -> float:
        """Fire one batch of each kind and of resends; how long to wait before the next."""
        fired, busy = 0, False
        for kind in self.durations.kinds:
            count = await self.fire_due(kind)
            busy = busy or count is None
            fired = max(fired, count or 0)
        fired = max(fired, await self.resend_due())
        await self._count_pending()
        await self._forget()
        if fired >= self.batch:
            return 0.0
        if busy:  # another replica is looking: look again shortly
            return min(self.poll_s, BUSY_PAUSE_S)
        until = await self._until_next()
        return self.poll_s if until is None else max(0.0, min(self.poll_s, until))

    async def fire_due(self, kind: Kind) -> int | None:
        """Fire the deadlines of ``kind`` due now and not fired, a batch in one transaction;
        how many (None: another replica is looking at that kind)."""
        now = at(self.clock())
        async with self.pool.acquire() as conn, conn.transaction():
            scanned_to = await store.lock_scan(conn, kind)
            if scanned_to is None:
                return None
            look = window(kind, scanned_to, now, self.durations)
            taken = await store.due_in(conn, kind, look, self.batch)
            await self._fire(conn, taken, now)
            reached = taken[-1].since if len(taken) >= self.batch else look.end
            await store.set_scanned(conn, kind, reached)
        self._report(taken, now)
        return len(taken)

    async def resend_due(self) -> int:
        """Send again the expiries due for it, in one transaction; how many."""
        now = at(self.clock())
        async with self.pool.acquire() as conn, conn.transaction():
            taken = await store.take_resends(conn, now, self.batch)
            await self._fire(conn, taken, now)
        self._report(taken, now)
        return len(taken)

    async def _fire(self, conn: Conn, taken: list[Due], now: datetime) -> None:
        if not taken:
            return
        with tracing.span("timers fire", {"gin.deadlines": len(taken)}):  # rows carry it on
            rows = [row for due in taken for row in await self._messages(conn, due, now)]
            if rows:
                await outbox.add_many(conn, rows)
            await store.record_fired(conn, [self._fired(due, now) for due in taken])

    async def _messages(self, conn: Conn, due: Due, now: datetime) -> list[OutboxRow]:
        """What firing ``due`` sends: nothing for an outdated reminder."""
        if due.kind == "expiry":
            return [expire_command(due, self.prefix)]
        if self.durations.superseded(due.kind, due.since, now):
            return []
        if due.kind != "absence":
            number = await store.next_announcement(conn, due.table_id, now)
            return [turn_reminder(due, now, number, self.durations, "waiting")]
        number = await store.next_announcement(conn, due.table_id, now)
        rows = [absence_claimable(due, now, number)]
        if self.durations.reminders_s:
            number = await store.next_announcement(conn, due.table_id, now)
            rows.append(turn_reminder(due, now, number, self.durations, "claimable"))
        return rows

    def _fired(self, due: Due, now: datetime) -> Fired:
        again: datetime | None = None
        if due.kind == "expiry" and due.attempts + 1 < MAX_EXPIRY_ATTEMPTS:
            again = now + timedelta(seconds=self.retry_s * 2**due.attempts)
        return Fired(due=due, fired_at=now, next_at=again)

    async def _until_next(self) -> float | None:
        """Seconds until the next deadline or resend is due (None: none known)."""
        now = at(self.clock())
        moments: list[datetime] = []
        async with self.pool.acquire() as conn:
            for kind in self.durations.kinds:
                end = window(kind, now, now, self.durations).end
                moment = await store.next_moment(conn, kind, end)
                if moment is not None:
                    moments.append(due_at(kind, moment, self.durations))
            resend = await store.next_resend(conn)
        if resend is not None:
            moments.append(resend)
        return None if not moments else (min(moments) - now).total_seconds()

    def _report(self, taken: list[Due], now: datetime) -> None:
        for due in taken:
            lag = (now - due_at(due.kind, due.since, self.durations)).total_seconds()
            skipped = self.durations.superseded(due.kind, due.since, now)
            if due.attempts == 0:
                self.metrics.fired.labels(due.kind).inc()
                self.metrics.lag.labels(due.kind).observe(lag)
            else:
                self.metrics.resent.inc()
            offset = reminder_offset(due.kind)
            if skipped:
                self.metrics.reminders_skipped.labels(str(offset)).inc()
            elif offset is not None:
                self.metrics.reminders.labels(str(offset)).inc()
            elif due.kind == "absence" and self.durations.reminders_s:
                self.metrics.reminders.labels("claimable").inc()
            log.info(
                "deadline_fired",
                table_id=due.table_id,
                kind=due.kind,
                seat=due.seat,
                seq=due.seq,
                since=due.since.isoformat(),
                lag_s=round(lag, 3),
                attempt=due.attempts + 1,
                skipped=skipped,
                command_id=(
                    expire_command_id(due.table_id, due.seq) if due.kind == "expiry" else None
                ),
            )
            if due.kind == "expiry" and due.attempts + 1 >= MAX_EXPIRY_ATTEMPTS:
                log.warning("expiry_unanswered", table_id=due.table_id, attempts=due.attempts + 1)

    async def _count_pending(self) -> None:
        """The deadlines due and not fired yet, at most once a second."""
        if time.monotonic() - self.pending_counted_at < PENDING_EVERY_S:
            return
        self.pending_counted_at = time.monotonic()
        now = at(self.clock())
        async with self.pool.acquire() as conn:
            reached = await store.scanned(conn, self.durations.kinds)
            for kind in self.durations.kinds:
                look = window(kind, reached[kind], now, self.durations)
                self.metrics.pending.labels(kind).set(await store.count_due(conn, kind, look))

    async def _forget(self) -> None:
        """Drop, once a minute, the firings no look will reach again."""
        if time.monotonic() - self.forgot_at < FORGET_EVERY_S:
            return
        self.forgot_at = time.monotonic()
        async with self.pool.acquire() as conn:
            reached = await store.scanned(conn, self.durations.kinds)
            for kind in self.durations.kinds:
                await store.forget(conn, kind, reached[kind] - LOOK_BACK)
