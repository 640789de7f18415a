"""``service.every``: the periodic work of the table's and the chat's maintenance runs at once,
then every so often, and one that fails is logged and tried again after the backoff."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import structlog

from shared.infra import service


async def test_work_runs_at_once_then_again_and_a_failure_is_retried_sooner() -> None:
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    async def work() -> None:
        calls.append(loop.time())
        if len(calls) == 2:
            raise ConnectionError("the database is away")

    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(service.every(0.5, work, "work_failed", backoff_s=0.01))
        async with asyncio.timeout(5):
            while len(calls) < 4:
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.49  # every ``seconds``
    assert gaps[1] < 0.49  # after a failure, the backoff
    assert gaps[2] >= 0.49
    (failed,) = [line for line in logs if line["event"] == "work_failed"]
    assert "the database is away" in failed["error"]
    assert failed["retry_in_s"] == 0.01
