"""The caller's tables (``GET /v1/players/me/tables``, the player socket): found by index,
theirs to play first, then the longest waiting, paged by an opaque cursor.

Found, never scanned: seat 0's person by ``tables_creator``, seat 1's by ``tables_joiner``
(migration 012), each table's turn by the primary key of the narrow ``deadlines`` (migration
009). A list reads its caller's tables only, however many the service keeps, and no index
moves with a move (the moves' updates stay HOT, migration 008).

The order (``Key``): group 0, the tables where the caller has the decision; group 1, the
other open ones; group 2, the finished ones (``?status=finished`` or ``all``); within a
group the oldest turn first (``turn_since``, else the last move), then the table id.

Paging while play goes on: a table's key only ever moves to the time of the change that
moved it (a decision given, a match over, a table closed), so a table whose key is not past
the first page's moment (the cursor's ``snapshot``) has not changed since, and keeps its
place. The pages walk those in order; after them comes a tail of the tables changed since
the first page (key past the snapshot), oldest change first: one that changes again moves
further down the tail, past the cursor. So no table is missed, and the last entry a client
gets of each table is its entry as it was when the paging reached it, after its last change
(a client keeps the last entry of a table id); one that changed after it was sent is sent
again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec

from services.table.deadlines import OPEN
from shared.contracts.api import ListStatus, MyTable, MyTables
from shared.contracts.events import Player
from shared.contracts.options import TableOptions
from shared.contracts.views import TableStatus
from shared.infra.db import Conn
from shared.infra.web import Refused

_FINISHED: tuple[TableStatus, ...] = ("closed", "expired")
STATUSES: dict[str, tuple[TableStatus, ...]] = {
    "open": tuple(OPEN),
    "finished": _FINISHED,
    "all": (*OPEN, *_FINISHED),
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAC_BYTES = 12

_seats_decoder = msgspec.json.Decoder(list[Player | None])
_options_decoder = msgspec.json.Decoder(TableOptions)


class _Scores(msgspec.Struct):
    """The scores of a table's engine state, decoded alone."""

    scores: tuple[int, int] = (0, 0)


_scores_decoder = msgspec.msgpack.Decoder(_Scores)


class Cursor(msgspec.Struct, frozen=True, array_like=True):
    """Where a page ends: the first page's moment, and the last entry's place: in the tail
    of tables changed since or not, its group (0 in the tail), key and table id."""

    snapshot_us: int
    tail: bool
    group: int
    key_us: int
    table_id: str


_cursor_encoder = msgspec.msgpack.Encoder()
_cursor_decoder = msgspec.msgpack.Decoder(Cursor)


def parse_status(text: str | None) -> ListStatus:
    """``?status=``: open (the default), finished or all; else 400 ``invalid_list_status``."""
    if text is None or text == "open":
        return "open"
    if text == "finished":
        return "finished"
    if text == "all":
        return "all"
    raise Refused(400, "invalid_list_status", "status is one of open, finished, all")


def _mac(secret: str, player: str, status: str, payload: bytes) -> bytes:
    """The cursor's signature: it is the server's, for this caller and this status."""
    key = hashlib.sha256(b"my-tables-cursor\0" + secret.encode()).digest()
    message = player.encode() + b"\0" + status.encode() + b"\0" + payload
    return hmac.new(key, message, hashlib.sha256).digest()[:_MAC_BYTES]


def encode_cursor(cursor: Cursor, secret: str, player: str, status: str) -> str:
    """The opaque ``next`` of a page: the cursor, signed, in URL-safe base64."""
    payload = _cursor_encoder.encode(cursor)
    raw = _mac(secret, player, status, payload) + payload
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(text: str, secret: str, player: str, status: str) -> Cursor:
    """A ``next`` this service gave this caller for this status; else 400 ``invalid_cursor``
    (garbled, forged, another caller's or another status's)."""
    refused = Refused(400, "invalid_cursor", "cursor is not one this list gave you")
    if not 0 < len(text) <= 400 or not text.isascii():
        raise refused
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise refused from None
    mac, payload = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, player, status, payload)):
        raise refused
    try:
        return _cursor_decoder.decode(payload)
    except msgspec.DecodeError:  # signed by us but not a cursor: a key shared elsewhere
        raise refused from None


def _us(moment: datetime) -> int:
    """A moment as whole microseconds since the epoch (PostgreSQL's precision)."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _moment(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


# The caller's tables with their place in the order (group g, key k, tail p), by index: each
# branch one index (seat 0's person, seat 1's), each table's turn by deadlines' primary key.
# The turn is a LATERAL lookup fenced by OFFSET 0: as a plain join, a caller with many tables
# got a hash join reading every row of deadlines, a cost that grows with the whole service.
# Only the page's rows then read their seats, options and scores. Row comparison on (p,
# group, key, id): the keyset of the cursor (the tail's group is 0: ordered by key alone).
_MINE = """
WITH mine AS (
    SELECT t.table_id, 0 AS you, t.status, t.last_move_at FROM tables t
    WHERE t.creator_id = $1 AND t.status = ANY($2::text[])
    UNION ALL
    SELECT t.table_id, 1 AS you, t.status, t.last_move_at FROM tables t
    WHERE (t.seats #>> '{1,id}') = $1 AND t.status = ANY($2::text[])
), keyed AS (
    SELECT m.table_id, m.you, d.absence_seat, d.absence_since, d.expiry_since,
        CASE WHEN m.status NOT IN ('waiting', 'playing', 'match_over') THEN 2
            WHEN m.status = 'playing' AND d.absence_seat = m.you THEN 0 ELSE 1 END AS g,
        coalesce(d.absence_since, d.expiry_since, m.last_move_at) AS k
    FROM mine m LEFT JOIN LATERAL (
        SELECT absence_seat, absence_since, expiry_since FROM deadlines
        WHERE deadlines.table_id = m.table_id OFFSET 0
    ) d ON true
), placed AS (
    SELECT *, (k > $3)::int AS p FROM keyed
), page AS (
    SELECT table_id, you, absence_seat, absence_since, expiry_since, g, k, p FROM placed
    WHERE (p, CASE WHEN p = 1 THEN 0 ELSE g END, k, table_id) > ($4, $5, $6, $7)
    ORDER BY p, CASE WHEN p = 1 THEN 0 ELSE g END, k, table_id
    LIMIT $8
)
SELECT page.*, t.status, t.seats::text AS seats, t.options::text AS options, t.state
FROM page JOIN tables t ON t.table_id = page.table_id
ORDER BY page.p, CASE WHEN page.p = 1 THEN 0 ELSE page.g END, page.k, page.table_id
"""

# One of the caller's tables (the player socket's frame), by the same branches.
_ONE = """
WITH mine AS (
    SELECT t.table_id, 0 AS you FROM tables t WHERE t.table_id = $2 AND t.creator_id = $1
    UNION ALL
    SELECT t.table_id, 1 AS you FROM tables t
    WHERE t.table_id = $2 AND (t.seats #>> '{1,id}') = $1
)
SELECT m.table_id, m.you, d.absence_seat, d.absence_since, d.expiry_since, t.status,
    t.seats::text AS seats, t.options::text AS options, t.state
FROM mine m JOIN tables t ON t.table_id = m.table_id
    LEFT JOIN deadlines d ON d.table_id = m.table_id
LIMIT 1
"""


class Lister:
    """Builds the caller's list: the delays of the absence rule and of expiry are the
    service's own settings (the ones the engine and the timers use)."""

    def __init__(self, absence_after_s: float, expiry_after_s: float, secret: str) -> None:
        self.absence_after = timedelta(seconds=absence_after_s)
        self.expiry_after = timedelta(seconds=expiry_after_s)
        self.secret = secret

    async def page(
        self,
        conn: Conn,
        player: str,
        status: ListStatus,
        limit: int,
        after: str | None,
        now: datetime,
    ) -> MyTables:
        """One page of ``player``'s tables with this status, after the cursor ``after`` (the
        first page without one, its snapshot ``now``)."""
        if after is None:
            cursor = Cursor(snapshot_us=_us(now), tail=False, group=-1, key_us=0, table_id="")
            place: tuple[int, int, datetime, str] = (-1, 0, _EPOCH, "")
        else:
            cursor = decode_cursor(after, self.secret, player, status)
            place = (int(cursor.tail), cursor.group, _moment(cursor.key_us), cursor.table_id)
        rows = await conn.fetch(
            _MINE,
            player,
            list(STATUSES[status]),
            _moment(cursor.snapshot_us),
            *place,
            limit + 1,
        )
        entries = [self.entry(r) for r in rows[:limit]]
        following = None
        if len(rows) > limit:
            last = rows[limit - 1]
            mark = Cursor(
                snapshot_us=cursor.snapshot_us,
                tail=bool(last["p"]),
                group=0 if last["p"] else last["g"],
                key_us=_us(last["k"]),
                table_id=last["table_id"],
            )
            following = encode_cursor(mark, self.secret, player, status)
        return MyTables(tables=entries, next=following)

    async def one(self, conn: Conn, player: str, table_id: str) -> MyTable | None:
        """``player``'s entry of one table (None: not seated there, or no such table)."""
        row = await conn.fetchrow(_ONE, player, table_id)
        return None if row is None else self.entry(row)

    def entry(self, row: asyncpg.Record) -> MyTable:
        """A list entry from a row of ``_MINE`` or ``_ONE``."""
        status: TableStatus = row["status"]
        is_open = status in OPEN
        to_act = row["absence_seat"] if status == "playing" else None
        since: datetime | None = row["absence_since"] if to_act is not None else None
        expiry: datetime | None = row["expiry_since"] if is_open else None
        state = row["state"]
        scores = (0, 0) if state is None else _scores_decoder.decode(state).scores
        return MyTable(
            table_id=row["table_id"],
            status=status,
            seats=_seats_decoder.decode(row["seats"]),
            you=row["you"],
            to_act=to_act,
            my_turn=to_act is not None and to_act == row["you"],
            turn_since=since,
            absence_claimable_at=None if since is None else since + self.absence_after,
            expires_at=None if expiry is None else expiry + self.expiry_after,
            scores=list(scores),
            options=_options_decoder.decode(row["options"]),
        )


async def open_table_ids(conn: Conn, player: str) -> list[str]:
    """The ids of ``player``'s open tables (the player socket's watch), by the same indexes."""
    rows = await conn.fetch(
        "SELECT table_id FROM tables WHERE creator_id = $1 AND status = ANY($2::text[])"
        " UNION ALL SELECT table_id FROM tables"
        " WHERE (seats #>> '{1,id}') = $1 AND status = ANY($2::text[])",
        player,
        list(STATUSES["open"]),
    )
    return [r[0] for r in rows]
