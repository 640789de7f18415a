"""The table service's data kept to a season (issue 32): a maintenance task per replica.

Every ``maintenance_every_s`` (and once at start) each replica tries to take a PostgreSQL
advisory lock; the one that holds it runs the steps, one after the other, and lets it go:
one replica at a time, and a replica that dies mid-run frees it with its session. Steps:

- ``partitions``: the event log's monthly partitions (migration 011) for the service clock's
  month and the next ``MONTHS_AHEAD``, each made beside the log and attached to it, with the
  rows of its month that fell into ``events_default`` meanwhile moved into it first. Moves
  wait for that transaction (a move routed to the default partition before it and written
  after it would break the default's new bounds), readers do not; with the task on time the
  month is made two months ahead, and its transaction moves nothing.
- ``command_answers``: the stored answers given ``command_retention_s`` ago or earlier (by the
  service's clock, as the move path writes them), ``maintenance_batch`` rows a transaction,
  a pause between transactions. A batch locks only its own rows (those another transaction
  holds are skipped) and waits ``LOCK_TIMEOUT_MS`` at most for anything: one that would wait
  longer gives way, and the next run goes on.

- ``empty_months``: the partitions of months that ended ``SETTLE`` or more before ``now``
  and hold no row any more (their tables all archived), detached and dropped: an empty
  month costs nothing to drop and would otherwise stay for good. The partition is locked
  first and found empty under the lock, so no row is dropped with it; detaching takes ACCESS
  EXCLUSIVE on ``events`` (with a default partition it cannot be done concurrently), waited
  for ``LOCK_TIMEOUT_MS`` at most, once a month.

Another step (the archive of finished tables) is a name and an ``async (conn, now) -> int``
added to ``steps``: it runs with the lock held, on the run's connection or any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.infra import service
from shared.infra.db import Conn, session_lock
from shared.infra.settings import Settings

log = structlog.get_logger()

MONTHS_AHEAD = 2  # besides the current month
LOCK_TIMEOUT_MS = 100  # the most a maintenance statement waits for a lock, then gives way
PAUSE_S = 0.02  # between two batches: the moves' statements come first
LOCK_NOT_AVAILABLE = "55P03"
ERROR_BACKOFF_S = 5.0
# A month's partition is dropped no sooner than this after the month ended: a replica whose
# clock is behind may still write the month's last events, and a move's statement may still
# be on its way.
SETTLE = timedelta(days=2)

# A step: what it did (rows deleted, partitions made, ...), given the run's connection (the
# one holding the lock) and the service clock's now.
Step = Callable[[Conn, datetime], Awaitable[int]]


class MaintenanceMetrics:
    """What the maintenance task reports on /metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.done = Counter(
            "gin_maintenance_items",
            "What each maintenance step did: command answers deleted, partitions made",
            ["step"],
            registry=registry,
        )
        self.gave_way = Counter(
            "gin_maintenance_gave_way",
            "Maintenance transactions that gave way to a lock held elsewhere (tried next run)",
            ["step"],
            registry=registry,
        )
        self.seconds = Histogram(
            "gin_maintenance_run_seconds",
            "How long each maintenance run took (this replica's, with the lock held)",
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
        )
        self.last_success = Gauge(
            "gin_maintenance_last_success_timestamp_seconds",
            "When this replica last finished a maintenance run (Unix time, service clock)",
            registry=registry,
        )


class GaveWay(Exception):
    """A step met a lock it will not wait for: what it did so far, the rest next run."""

    def __init__(self, done: int) -> None:
        super().__init__(f"gave way after {done}")
        self.done = done


@contextlib.contextmanager
def giving_way(done: int) -> Iterator[None]:
    """A lock not had within ``LOCK_TIMEOUT_MS`` ends the step: ``GaveWay`` with what it did
    so far (the next run goes on); any other error is the step's."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        if exc.sqlstate == LOCK_NOT_AVAILABLE:
            raise GaveWay(done) from exc
        raise


class Maintenance:
    """The maintenance task of one replica. ``run`` until cancelled."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: Settings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        schema: str = "gin_table",
    ) -> None:
        self.pool = pool
        self.every_s = settings.maintenance_every_s
        self.batch = settings.maintenance_batch
        self.retention = timedelta(seconds=settings.command_retention_s)
        self.clock = clock
        self.metrics = MaintenanceMetrics(registry)
        self.lock_key = zlib.crc32(f"maintenance:{schema}".encode())
        self.pause_s = PAUSE_S
        # In order, each with the lock held. The archive of finished tables goes here.
        self.steps: list[tuple[str, Step]] = [
            ("partitions", self.make_partitions),
            ("command_answers", self.delete_command_answers),
            ("empty_months", drop_empty_months),
        ]

    async def run(self) -> None:
        """A run now and every ``every_s``; survive database outages."""
        await service.every(self.every_s, self.run_once, "maintenance_failed", ERROR_BACKOFF_S)

    async def run_once(self) -> dict[str, int] | None:
        """Every step, if this replica takes the lock: what each did (None: another replica
        holds the lock)."""
        began = time.perf_counter()
        async with session_lock(self.pool, self.lock_key) as conn:
            if conn is None:
                return None
            done = await self._steps(conn)
        seconds = time.perf_counter() - began
        self.metrics.seconds.observe(seconds)
        self.metrics.last_success.set(self.clock())
        log.info("maintenance_ran", seconds=round(seconds, 3), **done)
        return done

    async def _steps(self, conn: Conn) -> dict[str, int]:
        done: dict[str, int] = {}
        for name, step in self.steps:
            now = datetime.fromtimestamp(self.clock(), UTC)
            try:
                done[name] = await step(conn, now)
            except GaveWay as exc:
                done[name] = exc.done
                self.metrics.gave_way.labels(name).inc()
            except asyncpg.PostgresError as exc:  # the next step may still do its part
                log.warning("maintenance_step_failed", step=name, error=repr(exc))
                done[name] = 0
            self.metrics.done.labels(name).inc(done[name])
        return done

    async def make_partitions(self, conn: Conn, now: datetime) -> int:
        """The event log's partitions of ``now``'s month and the next ``MONTHS_AHEAD``, those
        not made yet; how many were made."""
        made = 0
        for first in months_from(now, 1 + MONTHS_AHEAD):
            with giving_way(made):
                made += await make_month(conn, first)
        return made

    async def delete_command_answers(self, conn: Conn, now: datetime) -> int:
        """Delete the command answers given ``retention`` before ``now`` or earlier, in
        batches; how many."""
        cutoff = now - self.retention
        deleted = 0
        while True:
            with giving_way(deleted):
                async with conn.transaction():
                    await conn.execute(_SHORT_LOCK_WAIT)
                    status = await conn.execute(_DELETE_ANSWERS, cutoff, self.batch)
            count = int(status.split()[-1])
            deleted += count
            if count < self.batch:
                return deleted
            await asyncio.sleep(self.pause_s)


_SHORT_LOCK_WAIT = f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'"

# The oldest answers of one batch, locked as they are found (those another transaction holds
# are skipped: a retry of that very command, say), then deleted by their row address.
_DELETE_ANSWERS = """
DELETE FROM commands WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM commands WHERE answered_at < $1
    ORDER BY answered_at LIMIT $2 FOR UPDATE SKIP LOCKED))
"""


def months_from(now: datetime, count: int) -> list[datetime]:
    """The first moments (UTC) of ``now``'s month and the ``count - 1`` after it."""
    utc = now.astimezone(UTC)
    year, month = utc.year, utc.month
    firsts = []
    for _ in range(count):
        firsts.append(datetime(year, month, 1, tzinfo=UTC))
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return firsts


def partition_name(first: datetime) -> str:
    """The name of the event log's partition of the month beginning at ``first``."""
    return f"events_{first:%Y_%m}"


async def make_month(conn: Conn, first: datetime) -> bool:
    """Make the event log's partition of the month beginning at ``first`` (UTC) unless it is
    there; whether it was made. One transaction, giving way (``LOCK_NOT_AVAILABLE``) to a lock
    held more than ``LOCK_TIMEOUT_MS``:

    1. a table of its own, beside the log, with the log's columns;
    2. the log locked against writers (SHARE: a move in flight finishes first, and the next
       wait for this transaction, as short as the default partition is), and the month's rows
       moved out of ``events_default`` into it (ACCESS EXCLUSIVE on the default partition,
       which ATTACH takes anyway);
    3. a CHECK of its range, so ATTACH need not scan it; attached; the CHECK dropped.
    """
    name = partition_name(first)
    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name):
        return False
    after = months_from(first + timedelta(days=32), 1)[0]
    low, high = _literal(first), _literal(after)
    async with conn.transaction():
        await conn.execute(_SHORT_LOCK_WAIT)
        await conn.execute(f'CREATE TABLE "{name}" (LIKE events INCLUDING DEFAULTS)')
        # First the log itself, against writers (SHARE: reads go on): a move's statement that
        # had routed an event of this month to the default partition, then waited there for
        # this transaction, would find the default's bounds changed under it and fail. Moves
        # in flight finish first; the next wait here and route afresh once it commits.
        await conn.execute("LOCK TABLE events IN SHARE MODE")
        await conn.execute("LOCK TABLE events_default IN ACCESS EXCLUSIVE MODE")
        status = await conn.execute(
            f"WITH moved AS (DELETE FROM events_default WHERE at >= {low} AND at < {high}"
            f' RETURNING *) INSERT INTO "{name}" SELECT * FROM moved'
        )
        await conn.execute(
            f'ALTER TABLE "{name}" ADD CONSTRAINT "{name}_month"'
            f" CHECK (at >= {low} AND at < {high})"
        )
        await conn.execute(
            f'ALTER TABLE events ATTACH PARTITION "{name}" FOR VALUES FROM ({low}) TO ({high})'
        )
        await conn.execute(f'ALTER TABLE "{name}" DROP CONSTRAINT "{name}_month"')
    log.info("events_partition_made", partition=name, moved_from_default=int(status.split()[-1]))
    return True


def _literal(moment: datetime) -> str:
    """A moment as a timestamptz literal (ISO 8601, from a datetime: no quote in it)."""
    return f"'{moment.isoformat()}'::timestamptz"


async def drop_empty_months(conn: Conn, now: datetime) -> int:
    """Detach and drop the event log's monthly partitions that ended ``SETTLE`` before
    ``now`` and hold no row; how many. Each in one transaction, giving way to a lock."""
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'events'::regclass AND c.relname ~ '^events_[0-9]{4}_[0-9]{2}$'"
        " ORDER BY c.relname"
    )
    dropped = 0
    for (name,) in rows:
        first = datetime.strptime(name, "events_%Y_%m").replace(tzinfo=UTC)
        if months_from(first + timedelta(days=32), 1)[0] + SETTLE > now:
            break  # in name order: the later ones ended later still
        with giving_way(dropped):
            dropped += await _drop_if_empty(conn, name)
    return dropped


async def _drop_if_empty(conn: Conn, name: str) -> bool:
    async with conn.transaction():
        await conn.execute(_SHORT_LOCK_WAIT)
        await conn.execute(f'LOCK TABLE "{name}" IN ACCESS EXCLUSIVE MODE')  # no row comes in
        if await conn.fetchval(f'SELECT EXISTS (SELECT FROM "{name}")'):
            return False
        await conn.execute(f'ALTER TABLE events DETACH PARTITION "{name}"')
        await conn.execute(f'DROP TABLE "{name}"')
    log.info("events_partition_dropped", partition=name)
    return True
