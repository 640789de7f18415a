"""The chat kept a season (issue 32): a table's chat goes ``GIN_ARCHIVE_AFTER_S`` after it
closed or expired, as the table service archives the table itself (services/table/archive.py).

The chat learns that a table ended from ``table_closed`` and ``table_expired``, which it
consumes already; it needs no event of the archive, and it reads no other service's schema.
Each run, by the chat's own clock:

1. marks the tables ended since the last run (``ended_at``: migration 003), the moment it
   first saw them so; a run every ``GIN_MAINTENANCE_EVERY_S`` makes that minutes late, on a
   delay of months;
2. deletes the tables ended ``archive_after_s`` ago or earlier with their messages, seats and
   the table events applied, ``maintenance_batch`` tables a transaction (those a posting
   holds locked are skipped: they go next run).

Only with ``GIN_ARCHIVE_URL`` set, as the table's archive: where the tables are kept for
good, their chats are too. One replica at a time runs (an advisory lock of its session). The
chat's messages are not archived: the archive is the table's record, the chat is talk.
The messages' ``message_posted`` events already published are each subscriber's to keep
or not (the outbox keeps them ``GIN_OUTBOX_RETENTION_S``).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import structlog
from aiohttp import web

from services.chat.http import CHAT
from shared.infra import service
from shared.infra.db import Conn, session_lock
from shared.infra.service import POOL, SETTINGS

log = structlog.get_logger()

LOCK_KEY = zlib.crc32(b"maintenance:gin_chat")
PAUSE_S = 0.02  # between two batches: the postings' statements come first
ERROR_BACKOFF_S = 5.0

_MARK = """
UPDATE tables SET ended_at = $1
WHERE table_id IN (SELECT table_id FROM tables WHERE status <> 'open' AND ended_at IS NULL
    LIMIT $2 FOR UPDATE SKIP LOCKED)
"""

# One statement: the tables' rows and every row that names them (the foreign keys are checked
# at its end, when the messages and seats are gone too).
_FORGET = """
WITH gone AS (
    SELECT table_id FROM tables WHERE ended_at <= $1
    ORDER BY ended_at LIMIT $2 FOR UPDATE SKIP LOCKED
), m AS (
    DELETE FROM messages WHERE table_id IN (SELECT table_id FROM gone)
), s AS (
    DELETE FROM seats WHERE table_id IN (SELECT table_id FROM gone)
), a AS (
    DELETE FROM applied_events WHERE table_id IN (SELECT table_id FROM gone)
)
DELETE FROM tables WHERE table_id IN (SELECT table_id FROM gone)
"""


async def mark_ended(conn: Conn, now: datetime, batch: int) -> int:
    """Give up to ``batch`` tables seen closed or expired for the first time ``now`` as
    their end; how many."""
    return _count(await conn.execute(_MARK, now, batch))


async def forget_ended(conn: Conn, cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` tables ended by ``cutoff``, with their messages, seats and
    applied events; how many tables."""
    return _count(await conn.execute(_FORGET, cutoff, batch))


def _count(status: str) -> int:
    """The rows of an ``UPDATE n`` or ``DELETE n`` status."""
    return int(status.rsplit(" ", 1)[1])


async def run_once(
    pool: asyncpg.Pool, now: datetime, after_s: float, batch: int, pause_s: float = PAUSE_S
) -> int | None:
    """One run, if this replica takes the lock: the tables whose chat was deleted (None:
    another replica is running)."""
    async with session_lock(pool, LOCK_KEY) as conn:
        if conn is None:
            return None
        await _in_batches(lambda: mark_ended(conn, now, batch), batch, pause_s)
        cutoff = now - timedelta(seconds=after_s)
        forgotten = await _in_batches(lambda: forget_ended(conn, cutoff, batch), batch, pause_s)
    if forgotten:
        log.info("chat_tables_forgotten", tables=forgotten)
    return forgotten


async def _in_batches(batch_of: Callable[[], Awaitable[int]], batch: int, pause_s: float) -> int:
    """Batches until one is not full, with a pause between two; how many rows in all."""
    total = 0
    while True:
        done = await batch_of()
        total += done
        if done < batch:
            return total
        await asyncio.sleep(pause_s)


async def run(
    pool: asyncpg.Pool, clock: Callable[[], float], every_s: float, after_s: float, batch: int
) -> None:
    """A run now and every ``every_s``; a database away is tried again shortly."""

    async def once() -> int | None:
        return await run_once(pool, datetime.fromtimestamp(clock(), UTC), after_s, batch)

    await service.every(every_s, once, "chat_retention_failed", ERROR_BACKOFF_S)


async def running(app: web.Application) -> AsyncIterator[None]:
    """The app's retention task (a cleanup context, after the pool's), when
    ``GIN_ARCHIVE_URL`` is set."""
    settings = app[SETTINGS]
    if not settings.archive_url:
        yield
        return
    clock = app[CHAT].clock if CHAT in app else time.time
    task = asyncio.create_task(
        run(
            app[POOL],
            clock,
            settings.maintenance_every_s,
            settings.archive_after_s,
            settings.maintenance_batch,
        ),
        name="chat-retention",
    )
    yield
    await service.cancel(task)
