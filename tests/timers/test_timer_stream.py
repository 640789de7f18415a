"""The timer stream's numbers (issue 15, part 1): per table 1, 2, 3, ... without gaps and never
reused, even when firings of one table run at once or one rolls back."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg

from services.timers import store
from services.timers.app import migrate
from shared.infra.settings import Settings


async def test_numbers_are_gap_free_per_table_and_never_reused(settings: Settings) -> None:
    await migrate(settings)
    a, b = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    pool = await asyncpg.create_pool(
        settings.database_url, min_size=4, max_size=4, server_settings={"search_path": "gin_timers"}
    )
    assert pool is not None
    try:

        async def take(table_id: str, commit: bool = True) -> int | None:
            async with pool.acquire() as conn:
                transaction = conn.transaction()
                await transaction.start()
                number = await store.next_announcement(conn, table_id, datetime.now(UTC))
                await asyncio.sleep(0.01)  # the others wait for this table's row meanwhile
                if commit:
                    await transaction.commit()
                    return number
                await transaction.rollback()
                return None

        taken = await asyncio.gather(
            *(take(a) for _ in range(6)), take(a, commit=False), *(take(b) for _ in range(3))
        )
        numbers_a = sorted(n for n in taken[:6] if n is not None)
        assert numbers_a == [1, 2, 3, 4, 5, 6]  # the rolled-back one left no gap
        assert sorted(n for n in taken[7:] if n is not None) == [1, 2, 3]  # per table
        assert await take(a) == 7
    finally:
        await pool.close()
