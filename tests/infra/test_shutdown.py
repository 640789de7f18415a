"""A service's shutdown is bounded: its background tasks are cancelled and waited for, its
pool closed, each within a grace; what outstays the grace is logged, not waited for."""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from services.timers.deadlines import Durations
from services.timers.firing import Firing
from services.timers.metrics import TimerMetrics
from shared.infra import db, service
from shared.infra.settings import Settings
from tests.infra.cancelling import stops_when_cancelled


async def test_cancel_waits_for_its_tasks_and_raises_their_own_failure() -> None:
    stopped: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.append("background")

    async def failed() -> None:
        raise ValueError("it broke")

    tasks = [asyncio.create_task(background()), asyncio.create_task(failed())]
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="it broke"):
        await service.cancel(*tasks)
    assert stopped == ["background"]
    assert tasks[0].cancelled()


async def test_cancel_does_not_wait_for_good_for_a_task_that_ignores_it() -> None:
    async def stubborn() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # as 3.11's wait_for could
            await asyncio.sleep(60)
        await asyncio.sleep(60)

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with capture_logs() as logs:
        await service.cancel(task, grace_s=0.2)
    assert loop.time() - began < 2.0
    assert [(e["event"], e["task"]) for e in logs] == [
        ("task_ignored_its_cancellation", "stubborn")
    ]
    task.cancel()  # the second cancellation it does not ignore
    await asyncio.gather(task, return_exceptions=True)


async def test_cancel_passes_the_callers_own_cancellation_on() -> None:
    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.5)

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    stopping = asyncio.create_task(service.cancel(task))
    await asyncio.sleep(0.05)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await asyncio.gather(task, return_exceptions=True)


async def backend_gone(settings: Settings, pid: int) -> bool:
    """Whether PostgreSQL's backend ``pid`` has ended (within a few seconds)."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        for _ in range(100):
            if not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
                return True
            await asyncio.sleep(0.03)
        return False
    finally:
        await conn.close()


async def test_a_pool_whose_connection_never_comes_back_is_terminated(settings: Settings) -> None:
    pool = await db.create_pool(settings.database_url, "public", 2)
    held = await pool.acquire()  # a task that never releases it
    pid = held.get_server_pid()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with capture_logs() as logs:
        await service.close_pool(pool, grace_s=0.3)
    assert loop.time() - began < 3.0
    assert [e["event"] for e in logs] == ["pool_close_timed_out"]
    assert await backend_gone(settings, pid)


async def test_a_pool_whose_connections_come_back_closes_quietly(settings: Settings) -> None:
    pool = await db.create_pool(settings.database_url, "public", 2)
    held = await pool.acquire()
    pid = held.get_server_pid()

    async def release_soon() -> None:
        await asyncio.sleep(0.1)
        await pool.release(held)

    releasing = asyncio.create_task(release_soon())
    with capture_logs() as logs:
        await service.close_pool(pool, grace_s=5.0)
    await releasing
    assert logs == []
    assert await backend_gone(settings, pid)


async def test_the_timers_firing_cancelled_as_it_waits_stops() -> None:
    """The timer service's firing loop once waited as the relay did (3.11's wait_for, which
    drops a cancellation that comes in the turn of a wake-up): cancelled as it waits for its
    next look, it stops."""
    durations = Durations(absence_after_s=48 * 3600.0, expiry_after_s=7 * 86400.0)
    metrics = TimerMetrics(CollectorRegistry())
    firing = Firing(None, "test.", time.time, metrics, durations)  # type: ignore[arg-type]

    async def nothing_due() -> float:
        return 60.0

    firing.step = nothing_due  # type: ignore[method-assign]
    task = asyncio.create_task(firing.run())
    await asyncio.sleep(0.05)  # waiting for a wake-up
    stopped = await stops_when_cancelled(task, just_before=lambda: None)
    assert stopped, "the firing loop went on after its cancellation"
