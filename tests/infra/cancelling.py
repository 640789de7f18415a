"""Cancelling a background loop in tests: did it stop?"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def stops_when_cancelled(
    task: asyncio.Task[Any],
    ready: Callable[[], bool] = lambda: True,
    just_before: Callable[[], object] = lambda: None,
) -> bool:
    """Once ``ready()``, call ``just_before()`` and cancel ``task`` in the same turn: whether it
    ended, cancelled, within 5 s. A task still running then is cancelled again (that one
    goes through), so a failing test ends instead of hanging."""
    try:
        while not ready():
            await asyncio.sleep(0.01)
        just_before()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5.0)
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=5.0)
    return done == {task} and task.cancelled()
