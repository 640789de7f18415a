"""One way in for every command, whoever sends it: ``Commands.handle``.

HTTP (``POST /v1/tables/{id}/commands``), the table WebSocket and the broker's
``gin.commands`` (bots, timers) all call ``handle(actor, table_id, command)``. It refuses what
memory alone can refuse, then tries a person's command on the table's remembered row, saved
by the group commit in one statement (``Tables.command_at_once``), else locks and reads the
row in a transaction (``Tables.command``); it counts and times every command by its way, and
hands each committed change to the relay and this replica's sockets.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import asyncpg
import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.table.commits import GroupCommit
from services.table.decide import Actor
from services.table.port import PgStore
from services.table.store import Change
from services.table.tables import Tables
from shared.contracts.commands import Command

# Called with each committed change: the relay is woken and the WebSocket hub is handed it
# (delivered after the answer); it never raises, so a committed command never answers an error.
Committed = Callable[[Change], None]


class CommandMetrics:
    """Commands by type and outcome, and their latency."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.count = Counter(
            "gin_commands",
            "Table commands by type and outcome",
            ["type", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "gin_command_seconds",
            "Time to apply and commit one command",
            ["type"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )
        self.ways = Counter(
            "gin_command_ways",
            "Commands answered by the way they took: one statement on the remembered row (a"
            " person's), or the row locked and read (the first at a table, after a change"
            " elsewhere, a bot's or the timers', and every refusal)",
            ["way"],
            registry=registry,
        )


class Handled(msgspec.Struct, frozen=True):
    """A command's answer (its result as JSON) and its change (None: a repeated
    ``command_id``, answered with its first result)."""

    result: bytes
    change: Change | None


class Commands:
    """Runs every command of the table service (``handle``)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        tables: Tables,
        group_commit: GroupCommit,
        metrics: CommandMetrics,
        committed: Committed,
    ) -> None:
        self.pool = pool
        self.tables = tables
        self.group_commit = group_commit
        self.metrics = metrics
        self.committed = committed

    async def handle(self, actor: Actor, table_id: str, command: Command) -> Handled:
        """Apply one command: its answer, once committed (a refusal raises ``Rejected`` or
        ``IllegalAction`` and changes nothing)."""
        kind = type(command).__name__
        structlog.contextvars.bind_contextvars(command_id=command.command_id)
        start = time.perf_counter()
        outcome = "refused"
        try:
            handled = await self._run(actor, table_id, command)
            outcome = "applied"
            return handled
        finally:
            self.metrics.count.labels(kind, outcome).inc()
            self.metrics.seconds.labels(kind).observe(time.perf_counter() - start)

    async def _run(self, actor: Actor, table_id: str, command: Command) -> Handled:
        tables = self.tables
        tables.refuse_from_memory(table_id, actor, command)
        at_once = await tables.command_at_once(self.group_commit.save, table_id, actor, command)
        if at_once is not None:  # the group commit has handed the change on
            self.metrics.ways.labels("one_statement").inc()
            return Handled(*at_once)
        async with self.pool.acquire() as conn, conn.transaction():
            result, change = await tables.command(PgStore(conn), table_id, actor, command)
        self.metrics.ways.labels("locked").inc()
        if change is not None:
            self.committed(change)
        return Handled(result, change)
