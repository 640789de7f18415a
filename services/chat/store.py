"""The chat service's SQL: one function per statement, each on the caller's connection."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

import msgspec

from shared.contracts.events import Player
from shared.infra.db import Conn

TableStatus = Literal["open", "closed", "expired"]


class Posting(msgspec.Struct, frozen=True, kw_only=True):
    """A table locked for one new message, with the caller's seat there (if any)."""

    status: TableStatus
    last_message: int
    seat: int | None
    name: str | None
    version: int  # the highest table version the chat has applied an event of
    seats_known: int


class StoredMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message as stored."""

    table_id: str
    seq: int
    event_id: uuid.UUID
    seat: int
    player_id: str
    name: str
    text: str
    posted_at: datetime


# --- what the consumer learns from table events ---------------------------------------------


async def track(conn: Conn, table_id: str, seq: int, event_type: str) -> bool:
    """Record that a table event is applied; False if it was already (nothing to do)."""
    inserted = await conn.fetchval(
        "INSERT INTO applied_events (table_id, seq, type) VALUES ($1, $2, $3)"
        " ON CONFLICT DO NOTHING RETURNING true",
        table_id,
        seq,
        event_type,
    )
    return bool(inserted)


async def take_seat(conn: Conn, table_id: str, seat: int, player: Player) -> None:
    """A person or a bot sits in a seat (the table becomes known if it was not)."""
    await conn.execute("INSERT INTO tables (table_id) VALUES ($1) ON CONFLICT DO NOTHING", table_id)
    await conn.execute(
        "INSERT INTO seats (table_id, seat, player_id, name, bot) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (table_id, seat) DO UPDATE"
        " SET player_id = EXCLUDED.player_id, name = EXCLUDED.name, bot = EXCLUDED.bot",
        table_id,
        seat,
        player.id if player.bot is None else None,
        player.name,
        player.bot,
    )


async def erase_seat(conn: Conn, table_id: str, seat: int, pseudonym: Player) -> int:
    """The person of a seat was erased (``player_erased``): their messages at the table are
    deleted, with their outbox rows (published, kept a day, or not yet: never published then),
    and the seat shows the pseudonym. The messages' numbers are not used again. The number of
    messages deleted (0 for a bot's seat, or a seat the chat never learned)."""
    person = await conn.fetchval(
        "SELECT player_id FROM seats WHERE table_id = $1 AND seat = $2 AND bot IS NULL",
        table_id,
        seat,
    )
    if person is None:
        return 0
    deleted = await conn.fetch(
        "DELETE FROM messages WHERE table_id = $1 AND player_id = $2 RETURNING event_id",
        table_id,
        person,
    )
    await conn.execute(
        "DELETE FROM outbox WHERE message_id = ANY($1::text[])", [str(r[0]) for r in deleted]
    )
    await conn.execute(
        "UPDATE seats SET player_id = $3, name = $4 WHERE table_id = $1 AND seat = $2",
        table_id,
        seat,
        pseudonym.id,
        pseudonym.name,
    )
    return len(deleted)


async def close_table(conn: Conn, table_id: str, status: TableStatus) -> None:
    """The table closed or expired: its chat takes no new message. The first ending stays."""
    await conn.execute(
        "INSERT INTO tables (table_id, status) VALUES ($1, $2)"
        " ON CONFLICT (table_id) DO UPDATE SET status = EXCLUDED.status"
        " WHERE tables.status = 'open'",
        table_id,
        status,
    )


async def saw_version(conn: Conn, table_id: str, version: int) -> None:
    """The chat has applied an event of this table version (read-your-writes)."""
    await conn.execute(
        "UPDATE tables SET version = greatest(version, $2) WHERE table_id = $1", table_id, version
    )


# --- messages -------------------------------------------------------------------------------


async def lock_for_posting(conn: Conn, table_id: str, player_id: str) -> Posting | None:
    """Lock the table for this transaction; with it, the caller's seat. None: unknown table.

    The lock, then the seats, in two statements: in READ COMMITTED a statement that waited for
    the lock reads the locked row as committed meanwhile but every other row as of its start,
    so it would pair the version the consumer just applied with the seats from before it (the
    player just seated, refused as a spectator).
    """
    table = await conn.fetchrow(
        "SELECT status, last_message, version FROM tables WHERE table_id = $1 FOR UPDATE",
        table_id,
    )
    if table is None:
        return None
    seat = await conn.fetchrow(
        "SELECT s.seat, s.name, (SELECT count(*) FROM seats k WHERE k.table_id = $1) AS known"
        " FROM (SELECT 1) AS one LEFT JOIN seats s ON s.table_id = $1 AND s.player_id = $2"
        " ORDER BY s.seat LIMIT 1",
        table_id,
        player_id,
    )
    assert seat is not None
    return Posting(
        status=table["status"],
        last_message=table["last_message"],
        seat=seat["seat"],
        name=seat["name"],
        version=table["version"],
        seats_known=seat["known"],
    )


async def recent_posts(conn: Conn, player_id: str, since: datetime, limit: int) -> list[datetime]:
    """When the player posted after ``since``, newest first, at most ``limit``.

    The player's lock is taken first, for the rest of the transaction: two replicas (or two
    tables) cannot both let the same player's last allowed message through.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "chat:" + player_id)
    rows = await conn.fetch(
        "SELECT posted_at FROM messages WHERE player_id = $1 AND posted_at > $2"
        " ORDER BY posted_at DESC LIMIT $3",
        player_id,
        since,
        limit,
    )
    return [row["posted_at"] for row in rows]


async def insert_message(conn: Conn, message: StoredMessage) -> None:
    """Store a message and make its number the table's last."""
    await conn.execute(
        "UPDATE tables SET last_message = $2 WHERE table_id = $1", message.table_id, message.seq
    )
    await conn.execute(
        "INSERT INTO messages (table_id, seq, event_id, seat, player_id, name, text, posted_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        message.table_id,
        message.seq,
        message.event_id,
        message.seat,
        message.player_id,
        message.name,
        message.text,
        message.posted_at,
    )


async def messages_after(conn: Conn, table_id: str, after: int, limit: int) -> list[StoredMessage]:
    """A table's messages numbered above ``after``, in order, at most ``limit``."""
    rows = await conn.fetch(
        "SELECT table_id, seq, event_id, seat, player_id, name, text, posted_at FROM messages"
        " WHERE table_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        table_id,
        after,
        limit,
    )
    return [StoredMessage(**dict(row)) for row in rows]


async def table_status(conn: Conn, table_id: str) -> TableStatus | None:
    """A known table's status, or None."""
    status: TableStatus | None = await conn.fetchval(
        "SELECT status FROM tables WHERE table_id = $1", table_id
    )
    return status
