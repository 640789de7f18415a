"""The timer service's SQL: one function per job, each on the caller's connection."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from services.timers.deadlines import KINDS, Deadline, Kind, Timers
from shared.infra.db import Conn


class Due(msgspec.Struct, frozen=True, kw_only=True):
    """A deadline taken for firing: its table, and how often it was fired before."""

    table_id: str
    deadline: Deadline
    attempts: int


class Fired(msgspec.Struct, frozen=True, kw_only=True):
    """A deadline just fired, and when to fire it again (None: never)."""

    table_id: str
    kind: Kind
    next_at: datetime | None


_DEADLINE_COLUMNS = "kind, seat, since, seq, due_at"


def _deadline(record: asyncpg.Record) -> Deadline:
    return Deadline(
        kind=record["kind"],
        seat=record["seat"],
        since=record["since"],
        seq=record["seq"],
        due_at=record["due_at"],
    )


async def lock_table(conn: Conn, table_id: str) -> Timers:
    """The table's timers, its row locked until the caller's transaction ends (made if new)."""
    lock = "SELECT last_seq FROM tables WHERE table_id = $1 FOR UPDATE"
    last_seq = await conn.fetchval(lock, table_id)
    if last_seq is None:  # the table's first event here
        await conn.execute(
            "INSERT INTO tables (table_id, last_seq) VALUES ($1, 0) ON CONFLICT DO NOTHING",
            table_id,
        )
        last_seq = await conn.fetchval(lock, table_id)
    rows = await conn.fetch(
        f"SELECT {_DEADLINE_COLUMNS} FROM deadlines WHERE table_id = $1", table_id
    )
    found = {row["kind"]: _deadline(row) for row in rows}
    return Timers(last_seq=last_seq, absence=found.get("absence"), expiry=found.get("expiry"))


async def save_table(conn: Conn, table_id: str, before: Timers, after: Timers) -> list[Kind]:
    """Store the table's new timers; the kinds whose deadline was set anew.

    A deadline that did not change keeps its firing state (an absence announced once is not
    announced again because the absent seat drew a card); a new one is pending again.
    """
    await conn.execute(
        "UPDATE tables SET last_seq = $2, updated_at = now() WHERE table_id = $1",
        table_id,
        after.last_seq,
    )
    changed: list[Kind] = []
    for kind in KINDS:
        old, new = before.get(kind), after.get(kind)
        if new == old:
            continue
        if new is None:
            await conn.execute(
                "DELETE FROM deadlines WHERE table_id = $1 AND kind = $2", table_id, kind
            )
            continue
        await conn.execute(
            f"INSERT INTO deadlines (table_id, {_DEADLINE_COLUMNS}, next_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $6)"
            " ON CONFLICT (table_id, kind) DO UPDATE SET seat = $3, since = $4, seq = $5,"
            " due_at = $6, next_at = $6, fired_at = NULL, attempts = 0",
            table_id,
            kind,
            new.seat,
            new.since,
            new.seq,
            new.due_at,
        )
        changed.append(kind)
    return changed


async def take_due(conn: Conn, now: datetime, limit: int) -> list[Due]:
    """Deadlines to fire now, locked for the caller's transaction; rows another replica holds
    are skipped, so no two replicas take the same one."""
    rows = await conn.fetch(
        f"SELECT table_id, {_DEADLINE_COLUMNS}, attempts FROM deadlines"
        " WHERE next_at <= $1 ORDER BY next_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    return [
        Due(table_id=row["table_id"], deadline=_deadline(row), attempts=row["attempts"])
        for row in rows
    ]


async def mark_fired(conn: Conn, fired: list[Fired], now: datetime) -> None:
    """Record the firing of deadlines taken by ``take_due`` in this transaction."""
    await conn.executemany(
        "UPDATE deadlines SET fired_at = coalesce(fired_at, $3), attempts = attempts + 1,"
        " next_at = $4 WHERE table_id = $1 AND kind = $2",
        [(f.table_id, f.kind, now, f.next_at) for f in fired],
    )


async def next_due(conn: Conn) -> datetime | None:
    """When the earliest deadline left to fire is due."""
    value: datetime | None = await conn.fetchval(
        "SELECT next_at FROM deadlines WHERE next_at IS NOT NULL ORDER BY next_at LIMIT 1"
    )
    return value


async def pending(conn: Conn) -> dict[Kind, int]:
    """How many deadlines of each kind have not fired yet."""
    rows = await conn.fetch(
        "SELECT kind, count(*) AS n FROM deadlines WHERE fired_at IS NULL GROUP BY kind"
    )
    counts: dict[Kind, int] = dict.fromkeys(KINDS, 0)
    counts.update({row["kind"]: row["n"] for row in rows})
    return counts


async def next_announcement(conn: Conn, table_id: str) -> int:
    """The next number of the table's ``timer`` stream, taken in the caller's transaction."""
    number: int = await conn.fetchval(
        "INSERT INTO announcements (table_id, last_seq) VALUES ($1, 1)"
        " ON CONFLICT (table_id) DO UPDATE SET last_seq = announcements.last_seq + 1"
        " RETURNING last_seq",
        table_id,
    )
    return number
