"""Group commit: people's commands applied to remembered rows, saved many to a statement.

A command applied to its table's remembered row (``Tables.command_at_once``) is saved only if
that row is still current. Saving each in a statement of its own cost a round trip, a pool
connection and a commit per move: at saturation the statement path was the largest part of
the service's CPU, and PostgreSQL's. Here an attempt goes out at once when a statement slot
is free (alone, when the service is quiet: no added wait), and otherwise waits for the next
statement with every other that came meanwhile. Each statement commits on its own, so a
change that is saved is committed with it.

One attempt per table at a time: another at the same table, while one is waiting or under
way, is not taken (the caller takes the locked way, which waits for the row). So no two
statements ever write the same table row, and statements never wait on each other.

What a failed statement means for its attempts:
- PostgreSQL refused it (a lock or statement timeout, a conflict, bad data): it wrote
  nothing, so each attempt is "not saved" and its caller takes the locked way, which answers
  as it always does;
- the connection failed, or the server went away, under it: whether it committed is not known,
  so every caller gets the error (503: sent again with the same ``command_id``, a command
  applied already answers its first result).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import structlog
from prometheus_client import CollectorRegistry, Histogram

from services.table import store
from services.table.store import Attempt, Change
from shared.infra import tracing
from shared.infra.ops import count_buckets

log = structlog.get_logger()
# SQLSTATEs after which a statement may have committed: the connection's class, and the
# server shutting down or crashing under it (57P01 to 57P03).
_OUTCOME_UNKNOWN = ("08", "57P01", "57P02", "57P03")


def outcome_known(exc: BaseException) -> bool:
    """Whether a failed statement surely wrote nothing: PostgreSQL refused it (the statement
    and its commit are one: an error it reports rolled both back), and not because the
    connection or the server went away.

    >>> outcome_known(asyncpg.LockNotAvailableError("lock timeout"))
    True
    >>> outcome_known(asyncpg.AdminShutdownError("terminating connection"))
    False
    >>> outcome_known(ConnectionResetError())
    False
    """
    if not isinstance(exc, asyncpg.PostgresError):
        return False
    sqlstate = exc.sqlstate or ""
    return not sqlstate.startswith(_OUTCOME_UNKNOWN)


class GroupCommitMetrics:
    """How many changes each statement saved together."""

    def __init__(self, registry: CollectorRegistry, most: int) -> None:
        self.changes = Histogram(
            "gin_group_commit_changes",
            "Changes in one group-commit statement (people's commands on remembered rows)",
            registry=registry,
            buckets=count_buckets(most),
        )


class GroupCommit:
    """Saves ``Attempt``s, up to ``most`` to a statement and at most ``statements`` statements
    at once, on connections of ``pool``. ``committed`` is told each change saved, in the
    writer, before its caller resumes (so even a caller that has gone does not leave the
    sockets or the relay without it); it must not raise."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        committed: Callable[[Change], None],
        registry: CollectorRegistry,
        statements: int = 4,
        most: int = 64,
    ) -> None:
        self.pool = pool
        self.committed = committed
        self.statements = max(1, statements)
        self.most = max(1, most)
        self.metrics = GroupCommitMetrics(registry, self.most)
        # Waiting for a statement, by table, in arrival order; and the tables of those under way.
        self.waiting: dict[str, tuple[Attempt, asyncio.Future[bool]]] = {}
        self.under_way: set[str] = set()
        self.running: set[asyncio.Task[None]] = set()

    async def save(self, attempt: Attempt) -> bool:
        """Whether the attempt was saved (committed); False when it was not current, or when
        another attempt at its table is waiting or under way. Raises when its statement's
        outcome is not known (``outcome_known``)."""
        table_id = attempt.change.row.table_id
        if table_id in self.waiting or table_id in self.under_way:
            return False
        saved: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.waiting[table_id] = (attempt, saved)
        if len(self.running) < self.statements:
            self._start()
        try:
            return await saved
        finally:
            # A caller that gave up while waiting (cancelled) leaves no attempt behind.
            waiting = self.waiting.get(table_id)
            if waiting is not None and waiting[1] is saved:
                del self.waiting[table_id]

    def _start(self) -> None:
        """A statement for the attempts waiting longest (``most`` at the most)."""
        batch: list[tuple[Attempt, asyncio.Future[bool]]] = []
        while self.waiting and len(batch) < self.most:
            table_id = next(iter(self.waiting))
            batch.append(self.waiting.pop(table_id))
            self.under_way.add(table_id)
        if not batch:
            return
        task = asyncio.get_running_loop().create_task(self._write(batch), name="group-commit")
        self.running.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if self.waiting and len(self.running) < self.statements:
            self._start()

    async def _write(self, batch: list[tuple[Attempt, asyncio.Future[bool]]]) -> None:
        attempts = [attempt for attempt, _ in batch]
        self.metrics.changes.observe(len(attempts))
        try:
            try:
                parents = [attempt.change.traceparent for attempt in attempts]
                async with self.pool.acquire() as conn:
                    with tracing.on_behalf_of("group commit", parents):
                        saved = await store.save_if_current(conn, attempts)
            except Exception as exc:
                if not outcome_known(exc):
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    return
                log.warning("group_commit_refused", error=repr(exc), changes=len(attempts))
                saved = set()
            for attempt, future in batch:
                applied = attempt.change.row.table_id in saved
                if applied:
                    self.committed(attempt.change)
                if not future.done():
                    future.set_result(applied)
        finally:
            for attempt, future in batch:
                self.under_way.discard(attempt.change.row.table_id)
                if not future.done():  # cancelled before the statement ended: its caller knows
                    future.cancel()

    async def close(self) -> None:
        """Wait for the statements under way (each is bounded by the statement timeout)."""
        await asyncio.gather(*self.running, return_exceptions=True)
