"""Deadlines of the tables open before migration 009 (issue 29), filled in at start.

009 gives every open table its expiry from its row; a playing table's absence (whose decision,
since when) is in its engine state, which SQL cannot read: the service fills it in, a batch at
a time, on any replica (the batches skip each other's rows and the rows a move holds; a move's
own save fills its table in).
"""

from __future__ import annotations

import asyncio

import asyncpg
import msgspec
import structlog

from services.table.deadlines import DECIDING, deadlines_of
from services.table.store import STATE_DECODER
from shared.infra.db import Conn

log = structlog.get_logger()
BATCH = 500


async def run(pool: asyncpg.Pool) -> None:
    """Fill in the deadlines migration 009 left to the service, a batch at a time, then end
    (any replica may: the batches skip each other's rows)."""
    backfill_after = 0.0
    while True:
        await asyncio.sleep(backfill_after)
        try:
            async with pool.acquire() as conn:
                filled = await fill_in(conn, BATCH)
        except Exception as exc:  # the database away: try again shortly
            log.warning("deadlines_backfill_failed", error=repr(exc))
            backfill_after = 5.0
            continue
        if filled == 0:
            return
        log.info("deadlines_backfilled", tables=filled)
        backfill_after = 0.0


async def fill_in(conn: Conn, limit: int) -> int:
    """Fill in the deadlines of up to ``limit`` tables that migration 009 left to the service
    (a playing table's decision is in its engine state); how many. The absence's event is the
    table's last deciding one in its log. Tables a move holds are skipped: its save fills
    them in."""
    async with conn.transaction():
        records = await conn.fetch(
            "SELECT t.table_id, t.status, t.state, t.last_move_at, t.seq,"
            " (SELECT max(e.seq) FROM events e WHERE e.table_id = t.table_id"
            "  AND e.type = ANY($2::text[])) AS deciding"
            " FROM deadlines d JOIN tables t USING (table_id) WHERE d.backfill"
            " LIMIT $1 FOR UPDATE OF t, d SKIP LOCKED",
            limit,
            sorted(DECIDING),
        )
        filled = []
        for r in records:
            state = None if r["state"] is None else STATE_DECODER.decode(r["state"])
            due = deadlines_of(r["status"], state, r["last_move_at"], r["seq"])
            if due.absence_seat is not None and r["deciding"] is not None:
                due = msgspec.structs.replace(due, absence_seq=r["deciding"])
            filled.append((r["table_id"], *msgspec.structs.astuple(due)))
        await conn.executemany(
            "UPDATE deadlines SET absence_seat = $2, absence_since = $3, absence_seq = $4,"
            " expiry_since = $5, expiry_seq = $6, backfill = false WHERE table_id = $1",
            filled,
        )
    return len(records)
