"""The collector's pauses are measured (``ops.gc_pauses``), an app takes its hook away, and
what survives a full collection is frozen until the next thaw (``service.young_heap``)."""

from __future__ import annotations

import asyncio
import gc
import time

from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from shared.infra.ops import REGISTRY, gc_pauses, loop_lag
from shared.infra.service import SETTINGS, young_heap
from shared.infra.settings import Settings


async def test_every_full_collection_is_timed_and_the_hook_leaves_with_the_app() -> None:
    app = web.Application()
    registry = CollectorRegistry()
    app[REGISTRY] = registry
    hooks = len(gc.callbacks)
    gc_pauses(app)
    assert len(gc.callbacks) == hooks + 1
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        for _ in range(3):
            gc.collect(2)
        full = {"generation": "2"}
        assert registry.get_sample_value("gin_gc_pause_seconds_count", full) == 3
        assert registry.get_sample_value("gin_gc_pause_seconds_sum", full) > 0
    finally:
        await runner.cleanup()
    assert len(gc.callbacks) == hooks


async def test_survivors_of_a_full_collection_are_frozen_and_all_thawed_on_schedule() -> None:
    app = web.Application()
    app[SETTINGS] = Settings(gc_thaw_s=3.0)
    app.cleanup_ctx.append(young_heap)
    gc.unfreeze()
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        with capture_logs() as logs:
            survivors = [[n] for n in range(5000)]  # tracked, and alive past a collection
            gc.collect()
            async with asyncio.timeout(5):  # frozen within the policy's next second
                while gc.get_freeze_count() < len(survivors):
                    await asyncio.sleep(0.1)
            async with asyncio.timeout(10):  # then all thawed and collected, on schedule
                while not any(e["event"] == "heap_thawed_and_collected" for e in logs):
                    await asyncio.sleep(0.1)
            assert survivors[-1] == [4999]
    finally:
        await runner.cleanup()
        gc.unfreeze()


async def test_a_full_collection_comes_every_gc_full_every_s_and_freezes_what_came() -> None:
    """No collection is asked for here (and 5,000 new lists set off none of Python's own full
    ones): the policy's own, every 0.2 s, freezes them."""
    app = web.Application()
    app[SETTINGS] = Settings(gc_thaw_s=3600.0, gc_full_every_s=0.2)
    app.cleanup_ctx.append(young_heap)
    gc.unfreeze()
    gc.collect()
    frozen = gc.get_freeze_count()
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        survivors = [[n] for n in range(5000)]
        async with asyncio.timeout(3):
            while gc.get_freeze_count() < frozen + len(survivors):
                await asyncio.sleep(0.05)
        assert survivors[-1] == [4999]
    finally:
        await runner.cleanup()
        gc.unfreeze()


async def test_a_loop_held_by_a_long_pass_shows_in_the_loop_lag() -> None:
    app = web.Application()
    registry = CollectorRegistry()
    app[REGISTRY] = registry
    app.cleanup_ctx.append(loop_lag)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await asyncio.sleep(0.2)  # the sampler is running
        time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop held, as a long pass would)
        await asyncio.sleep(0.2)
        count = registry.get_sample_value("gin_event_loop_lag_seconds_count")
        within = registry.get_sample_value("gin_event_loop_lag_seconds_bucket", {"le": "0.1"})
        assert count is not None
        assert within is not None
        assert count - within >= 1  # one timer ran more than 0.1 s late
    finally:
        await runner.cleanup()
