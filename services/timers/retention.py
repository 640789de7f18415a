"""The timers' share of a season of data (issue 32): a table's timer-stream counter
(``announcements``) goes once the table service has archived the table, that is once the table
has no deadlines row any more and its counter was last taken ``GIN_ARCHIVE_AFTER_S`` ago; so
do its firings (``fired``: absences, expiries no longer sent again, and turn reminders, also
those of an offset no longer in ``GIN_TURN_REMINDERS_S``, which no look reaches any more)
whose moment is that old. A
restored table is an ended one, which never fires again, so its numbering never restarts.
One replica at a time (a session advisory lock), every ``GIN_MAINTENANCE_EVERY_S``, only when
``GIN_ARCHIVE_URL`` is set (else nothing is archived)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
from aiohttp import web

from services.timers import store
from shared.infra import service
from shared.infra.db import session_lock
from shared.infra.service import POOL, SETTINGS

LOCK_KEY = zlib.crc32(b"maintenance:gin_timers")
PAUSE_S = 0.02  # between two batches: the firings' statements come first


async def run_once(pool: asyncpg.Pool, now: datetime, after_s: float, batch: int) -> int | None:
    """One run, if this replica takes the lock: the counters and firings deleted (None:
    another replica is running)."""
    cutoff = now - timedelta(seconds=after_s)
    async with session_lock(pool, LOCK_KEY) as conn:
        if conn is None:
            return None
        total = 0
        for forget in (store.forget_announcements, store.forget_fired):
            while (done := await forget(conn, cutoff, batch)) == batch:
                total += done
                await asyncio.sleep(PAUSE_S)
            total += done
        return total


def running(clock: Callable[[], float]) -> Callable[[web.Application], AsyncIterator[None]]:
    """The app's retention task (a cleanup context, after the pool's), when
    ``GIN_ARCHIVE_URL`` is set."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        if not settings.archive_url:
            yield
            return

        async def once() -> int | None:
            now = datetime.fromtimestamp(clock(), UTC)
            return await run_once(
                app[POOL], now, settings.archive_after_s, settings.maintenance_batch
            )

        task = asyncio.create_task(
            service.every(settings.maintenance_every_s, once, "timer_retention_failed")
        )
        yield
        await service.cancel(task)

    return context
