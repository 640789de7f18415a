"""The timer service's SQL: one function per job, each on the caller's connection.

The deadlines themselves are the table service's (``TIMER_DEADLINES``, a view of the
``gin_table.deadlines`` rows its every change writes: services/table/deadlines.py); this
service may read that view and nothing else of the table's schema. Its own tables keep what
it fired (``fired``) and how far it has looked (``scans``).
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.timers.deadlines import Due, Kind, Window, source
from shared.infra.db import Conn

# The table service's view of its tables' deadlines (services/table/migrations/009).
TIMER_DEADLINES = "gin_table.timer_deadlines"
# A replica that stops answering (paused, cut off) inside a firing transaction would hold its
# locks, and so every other replica's looks, for as long as its connection lives: PostgreSQL
# ends such a transaction after this long idle (a batch's statements take milliseconds).
HOLD_MS = 15_000
_HOLD = f"SELECT set_config('idle_in_transaction_session_timeout', '{HOLD_MS}', true)"


class Fired(msgspec.Struct, frozen=True, kw_only=True):
    """A deadline just fired, and when to fire it again (None: never)."""

    due: Due
    fired_at: datetime
    next_at: datetime | None


async def readable(conn: Conn) -> None:
    """Raise unless the table service's deadlines can be read (its migration 009 makes the
    view and lets this service's role read it)."""
    await conn.execute(f"SELECT FROM {TIMER_DEADLINES} LIMIT 0")


async def lock_scan(conn: Conn, kind: Kind) -> datetime | None:
    """How far deadlines of ``kind`` were looked at, locked for the caller's transaction;
    None while another replica holds it (it is looking now)."""
    await conn.execute(_HOLD)
    value: datetime | None = await conn.fetchval(
        "SELECT scanned_to FROM scans WHERE kind = $1 FOR UPDATE SKIP LOCKED", kind
    )
    return value


async def set_scanned(conn: Conn, kind: Kind, to: datetime) -> None:
    """Record that deadlines of ``kind`` up to the moment ``to`` were looked at."""
    await conn.execute(
        "UPDATE scans SET scanned_to = greatest(scanned_to, $2) WHERE kind = $1", kind, to
    )


def _columns(kind: Kind) -> str:
    """The view's columns of one kind as (seat, since, seq)."""
    if source(kind) == "absence":
        return "d.absence_seat AS seat, d.absence_since AS since, d.absence_seq AS seq"
    return "NULL::smallint AS seat, d.expiry_since AS since, d.expiry_seq AS seq"


def _unfired_in(kind: Kind) -> str:
    """FROM and WHERE of the deadlines of ``kind`` with their moment in ($1, $2] that were
    not fired ($3: the kind)."""
    column = source(kind)
    return (
        f"FROM {TIMER_DEADLINES} d WHERE d.{column}_since > $1 AND d.{column}_since <= $2"
        " AND NOT EXISTS (SELECT FROM fired f WHERE f.table_id = d.table_id"
        f" AND f.kind = $3 AND f.seq >= d.{column}_seq)"
    )


async def due_in(conn: Conn, kind: Kind, look: Window, limit: int) -> list[Due]:
    """Up to ``limit`` deadlines of ``kind`` whose moment is in ``look`` and that were not
    fired, oldest first."""
    rows = await conn.fetch(
        f"SELECT d.table_id, {_columns(kind)} {_unfired_in(kind)}"
        f" ORDER BY d.{source(kind)}_since LIMIT $4",
        look.start,
        look.end,
        kind,
        limit,
    )
    return [
        Due(table_id=r["table_id"], kind=kind, seat=r["seat"], since=r["since"], seq=r["seq"])
        for r in rows
    ]


async def count_due(conn: Conn, kind: Kind, look: Window) -> int:
    """How many deadlines of ``kind`` are due in ``look`` and not fired."""
    count: int = await conn.fetchval(
        f"SELECT count(*) {_unfired_in(kind)}",
        look.start,
        look.end,
        kind,
    )
    return count


async def next_moment(conn: Conn, kind: Kind, after: datetime) -> datetime | None:
    """The earliest moment of a deadline of ``kind`` after ``after`` (not due yet)."""
    column = source(kind)
    value: datetime | None = await conn.fetchval(
        f"SELECT min({column}_since) FROM {TIMER_DEADLINES} WHERE {column}_since > $1", after
    )
    return value


async def take_resends(conn: Conn, now: datetime, limit: int) -> list[Due]:
    """Expiries fired before, due to be sent again and still the table's, locked for the
    caller's transaction (rows another replica holds are skipped). An expiry the table has
    since replaced (a move) or reported (closed) is sent no more."""
    await conn.execute(_HOLD)
    await conn.execute(
        "UPDATE fired f SET next_at = NULL WHERE f.kind = 'expiry' AND f.next_at <= $1"
        f" AND NOT EXISTS (SELECT FROM {TIMER_DEADLINES} d"
        "  WHERE d.table_id = f.table_id AND d.expiry_seq = f.seq)",
        now,
    )
    rows = await conn.fetch(
        "SELECT f.table_id, f.since, f.seq, f.attempts FROM fired f"
        " WHERE f.kind = 'expiry' AND f.next_at <= $1 ORDER BY f.next_at LIMIT $2"
        " FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    return [
        Due(
            table_id=r["table_id"],
            kind="expiry",
            seat=None,
            since=r["since"],
            seq=r["seq"],
            attempts=r["attempts"],
        )
        for r in rows
    ]


async def record_fired(conn: Conn, fired: list[Fired]) -> None:
    """Record firings in the caller's transaction: each table's last of each kind."""
    await conn.executemany(
        "INSERT INTO fired (table_id, kind, seq, since, fired_at, attempts, next_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7)"
        " ON CONFLICT (table_id, kind) DO UPDATE SET seq = $3, since = $4,"
        " fired_at = CASE WHEN fired.seq = $3 THEN fired.fired_at ELSE $5 END,"
        " attempts = $6, next_at = $7",
        [
            (
                f.due.table_id,
                f.due.kind,
                f.due.seq,
                f.due.since,
                f.fired_at,
                f.due.attempts + 1,
                f.next_at,
            )
            for f in fired
        ],
    )


async def forget(conn: Conn, kind: Kind, before: datetime) -> int:
    """Drop the firings of ``kind`` whose moment no look reaches any more (nor will: looks
    only move forward), and that are not to be sent again; how many."""
    status: str = await conn.execute(
        "DELETE FROM fired WHERE kind = $1 AND next_at IS NULL AND since < $2", kind, before
    )
    return int(status.rpartition(" ")[2])


async def next_resend(conn: Conn) -> datetime | None:
    """When the earliest expiry is to be sent again."""
    value: datetime | None = await conn.fetchval(
        "SELECT min(next_at) FROM fired WHERE next_at IS NOT NULL"
    )
    return value


async def scanned(conn: Conn, kinds: tuple[Kind, ...]) -> dict[Kind, datetime]:
    """How far each of ``kinds`` was looked at (no lock)."""
    rows = await conn.fetch("SELECT kind, scanned_to FROM scans WHERE kind = any($1)", kinds)
    found = {row["kind"]: row["scanned_to"] for row in rows}
    return {kind: found[kind] for kind in kinds}


async def add_scans(conn: Conn, kinds: tuple[Kind, ...]) -> None:
    """A ``scans`` row for each of ``kinds`` that has none (a reminder offset new to this
    deployment): its first look starts at 1970, so every turn already past the offset and
    not past the next reminder is reminded once."""
    await conn.execute(
        "INSERT INTO scans (kind, scanned_to) SELECT unnest($1::text[]), 'epoch'"
        " ON CONFLICT (kind) DO NOTHING",
        kinds,
    )


async def next_announcement(conn: Conn, table_id: str, now: datetime) -> int:
    """The next number of the table's ``timer`` stream, taken in the caller's transaction."""
    number: int = await conn.fetchval(
        "INSERT INTO announcements (table_id, last_seq, announced_at) VALUES ($1, 1, $2)"
        " ON CONFLICT (table_id) DO UPDATE SET last_seq = announcements.last_seq + 1,"
        " announced_at = $2 RETURNING last_seq",
        table_id,
        now,
    )
    return number


# Counters idle since before $1 whose table has no deadlines row any more (archived: an open
# or ended table keeps its row, and a restored one, ended, never fires again).
_FORGET_ANNOUNCEMENTS = f"""
DELETE FROM announcements WHERE table_id IN (
    SELECT a.table_id FROM announcements a WHERE a.announced_at < $1
        AND NOT EXISTS (SELECT FROM {TIMER_DEADLINES} d WHERE d.table_id = a.table_id)
    LIMIT $2 FOR UPDATE SKIP LOCKED)
"""


async def forget_announcements(conn: Conn, cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` counters of archived tables idle since ``cutoff``; how many."""
    status = await conn.execute(_FORGET_ANNOUNCEMENTS, cutoff, batch)
    return int(status.split()[-1])


# Firings (of any kind: a reminder offset no longer configured is never looked at again, so
# its rows would stay) of archived tables whose moment is before $1.
_FORGET_FIRED = f"""
DELETE FROM fired WHERE (table_id, kind) IN (
    SELECT f.table_id, f.kind FROM fired f WHERE f.since < $1 AND f.next_at IS NULL
        AND NOT EXISTS (SELECT FROM {TIMER_DEADLINES} d WHERE d.table_id = f.table_id)
    LIMIT $2 FOR UPDATE SKIP LOCKED)
"""


async def forget_fired(conn: Conn, cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` firings of archived tables from before ``cutoff``; how many."""
    status = await conn.execute(_FORGET_FIRED, cutoff, batch)
    return int(status.split()[-1])
