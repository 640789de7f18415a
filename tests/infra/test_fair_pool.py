"""The services' connection pool serves first come, first served (``db.FairPool``), on a real
PostgreSQL: asyncpg's own pool lets a newcomer take a connection released for a waiter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.infra import db
from shared.infra.settings import Settings


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await db.create_pool(settings.database_url, "public", 1)
    try:
        yield pool
    finally:
        pool.terminate()  # a failed test may leave a connection out


async def test_connections_go_to_those_waiting_in_the_order_they_came(
    pool: asyncpg.Pool,
) -> None:
    served: list[int] = []

    async def query(n: int) -> None:
        async with pool.acquire() as conn:
            served.append(n)
            await conn.fetchval("SELECT 1")

    arrivals = []
    for n in range(60):  # one at a time, while the earlier ones are being served
        arrivals.append(asyncio.create_task(query(n)))
        for _ in range(n % 4):
            await asyncio.sleep(0)
    await asyncio.gather(*arrivals)
    assert served == list(range(60))


async def test_one_who_gives_up_waiting_leaves_no_hole_in_the_line(pool: asyncpg.Pool) -> None:
    async def wait_in_line() -> None:
        async with pool.acquire():
            pass

    held = await pool.acquire()
    impatient = asyncio.create_task(wait_in_line())
    with pytest.raises(TimeoutError):
        async with pool.acquire(timeout=0.1):
            pass
    await asyncio.sleep(0.05)
    impatient.cancel()
    await asyncio.gather(impatient, return_exceptions=True)
    await pool.release(held)
    async with asyncio.timeout(2):  # the one connection is free again, and only once
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1
            with pytest.raises(TimeoutError):
                async with pool.acquire(timeout=0.1):
                    pass
