"""No lost turn: a bot's turn that got no move in time is sent again.

Every change that gives a bot the turn writes its turn message to the outbox and, in the same
statement, the moment it is due again (``tables.bot_turn_due_at``: ``bot_turn_resend_s``
later). A move clears or replaces it. If that moment passes (the turn, or the bot's command,
was dead-lettered, dropped or lost with a broker), this loop writes the same turn to the outbox
again and sets the next moment, twice as far (``MAX_RESEND_S`` at most): a match never waits
on a lost message. The bot's command id and expected version come from the turn's table
version, so a turn sent twice makes one move (the second answers the first's result, or is
refused as stale).

Any number of replicas run it: due tables are taken ``FOR UPDATE SKIP LOCKED`` (a table being
moved, or resent by another replica, is skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta

import asyncpg
import structlog
from prometheus_client import CollectorRegistry, Counter

from services.table import store
from services.table.tables import Tables
from shared.infra import outbox, tracing

log = structlog.get_logger()
MAX_RESEND_S = 600.0
BATCH = 100
ERROR_BACKOFF_MAX_S = 5.0


class BotTurnResend:
    """Sends due bot turns again. ``run`` until cancelled."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        tables: Tables,
        registry: CollectorRegistry,
        wake_relay: Callable[[], None],
        resend_s: float = 30.0,
        poll_s: float | None = None,
    ) -> None:
        self.pool = pool
        self.tables = tables
        self.wake_relay = wake_relay
        self.resend_s = resend_s
        self.poll_s = poll_s if poll_s is not None else max(0.05, resend_s / 6)
        self.resent = Counter(
            "gin_bot_turns_resent",
            "Bot turns sent again: no move came within bot_turn_resend_s (doubling after)",
            registry=registry,
        )

    async def run(self) -> None:
        """Resend due turns every ``poll_s``; survive database outages."""
        backoff = self.poll_s
        while True:
            try:
                while await self.resend_due() >= BATCH:
                    pass
                backoff = self.poll_s
            except Exception as exc:
                log.warning("bot_turn_resend_failed", error=repr(exc))
                backoff = min(backoff * 2, ERROR_BACKOFF_MAX_S)
            await asyncio.sleep(backoff)

    async def resend_due(self) -> int:
        """Write every due bot turn to the outbox again, in one transaction; how many."""
        now = self.tables.now()
        resent: list[tuple[str, int, float]] = []
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await store.take_due_bot_turns(conn, now, BATCH)
            if not rows:
                return 0
            messages: list[store.OutboxRow] = []
            table_ids: list[str] = []
            due: list[datetime | None] = []
            for row in rows:
                waited = (now - row.last_move_at).total_seconds()
                message = self.tables.bot_turn_message(row, f"resent-after-{int(waited)}s")
                table_ids.append(row.table_id)
                if message is None:  # no bot has the turn any more (a repair, not a move)
                    due.append(None)
                    continue
                messages.append(message)
                again = min(max(waited, self.resend_s), MAX_RESEND_S)  # doubling
                due.append(now + timedelta(seconds=again))
                resent.append((row.table_id, row.version, waited))
            with tracing.span("bot turns resend", {"gin.bot_turns": len(messages)}):
                await outbox.add_many(conn, messages)
            await store.set_bot_turn_due(conn, table_ids, due)
        with contextlib.suppress(Exception):  # committed: the relay's poll will find them
            self.wake_relay()
        for table_id, version, waited in resent:
            self.resent.inc()
            log.warning(
                "bot_turn_resent", table_id=table_id, version=version, waited_s=round(waited, 1)
            )
        return len(rows)
