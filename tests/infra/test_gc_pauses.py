"""The collector's pauses are measured (``ops.gc_pauses``), and an app takes its hook away."""

from __future__ import annotations

import gc

from aiohttp import web
from prometheus_client import CollectorRegistry

from shared.infra.ops import REGISTRY, gc_pauses


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
