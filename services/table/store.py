"""The table service's SQL: one function per statement, each on the caller's connection."""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from services.table.deadlines import deadlines_of
from shared.contracts.api import BotTurn
from shared.contracts.envelope import Envelope
from shared.contracts.events import HandEnded, Player
from shared.contracts.names import BOTS_EXCHANGE, EVENTS_EXCHANGE, bot_key, table_event_key
from shared.contracts.options import TableOptions
from shared.contracts.views import TableStatus, TableView
from shared.engine.state import GameState
from shared.infra.db import Conn

_state_encoder = msgspec.msgpack.Encoder()
STATE_DECODER = msgspec.msgpack.Decoder(GameState)

_json = msgspec.json.Encoder()
_seats_decoder = msgspec.json.Decoder(list[Player | None])
_options_decoder = msgspec.json.Decoder(TableOptions)


class TableRow(msgspec.Struct, kw_only=True):
    """One table as stored."""

    table_id: str
    invite_code: str
    creator_id: str
    options: TableOptions
    seats: list[Player | None]
    status: TableStatus
    state: GameState | None
    version: int
    seq: int
    created_at: datetime
    last_move_at: datetime

    def seat_of(self, player_id: str | None) -> int | None:
        """The seat of a person, if seated."""
        if player_id is None:
            return None
        for i, seat in enumerate(self.seats):
            if seat is not None and seat.id == player_id:
                return i
        return None


_COLUMNS = (
    "table_id, invite_code, creator_id, options::text, seats::text, status, state,"
    " version, seq, created_at, last_move_at"
)


def _row(record: asyncpg.Record) -> TableRow:
    state = record["state"]
    return TableRow(
        table_id=record["table_id"],
        invite_code=record["invite_code"],
        creator_id=record["creator_id"],
        options=_options_decoder.decode(record["options"]),
        seats=_seats_decoder.decode(record["seats"]),
        status=record["status"],
        state=None if state is None else STATE_DECODER.decode(state),
        version=record["version"],
        seq=record["seq"],
        created_at=record["created_at"],
        last_move_at=record["last_move_at"],
    )


async def insert_table(conn: Conn, row: TableRow) -> None:
    """Store a new table."""
    await conn.execute(
        "INSERT INTO tables (table_id, invite_code, creator_id, options, seats, status, state,"
        " version, seq, created_at, last_move_at)"
        " VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6, $7, $8, $9, $10, $11)",
        row.table_id,
        row.invite_code,
        row.creator_id,
        _json.encode(row.options).decode(),
        _json.encode(row.seats).decode(),
        row.status,
        None if row.state is None else _state_encoder.encode(row.state),
        row.version,
        row.seq,
        row.created_at,
        row.last_move_at,
    )


class Locked(msgspec.Struct, kw_only=True):
    """A table locked for one command, with what the command needs to know."""

    row: TableRow
    prior: str | None  # the stored result of this actor's command_id, if it ran already
    deck_design: str | None  # the caller's


_KNOWN = (
    "(SELECT result FROM commands WHERE table_id = $1 AND actor = $4 AND command_id = $2)"
    " AS prior, (SELECT deck_design FROM preferences WHERE player_id = $3) AS design"
)


async def lock_for_command(
    conn: Conn,
    table_id: str,
    command_id: str | None = None,
    player_id: str | None = None,
    actor: str | None = None,
) -> Locked | None:
    """Lock the table for this transaction, with the prior result of this actor's command_id
    (ids are scoped by who sends them) and the deck design.

    The locking statement also reads them, from its own snapshot, and the table's version in
    that snapshot. If another transaction changed the row while this one waited for the lock,
    the versions differ and the two are read again in a new statement, whose snapshot sees
    that commit (a command result is only ever written with a change of the row).
    """
    record = await conn.fetchrow(
        f"SELECT {_COLUMNS}, {_KNOWN},"
        " (SELECT version FROM tables s WHERE s.table_id = $1) AS seen_version"
        " FROM tables t WHERE table_id = $1 FOR UPDATE OF t",
        table_id,
        command_id,
        player_id,
        actor,
    )
    if record is None:
        return None
    known: asyncpg.Record | None = record
    if record["seen_version"] != record["version"]:  # we waited behind a commit
        known = await conn.fetchrow(f"SELECT {_KNOWN}", table_id, command_id, player_id, actor)
    assert known is not None
    return Locked(row=_row(record), prior=known["prior"], deck_design=known["design"])


class Seating(msgspec.Struct, frozen=True, kw_only=True):
    """Who sits at a table and the code to join it: what refuses a spectator or a wrong code
    without the row lock. Seats are only ever filled, never emptied (R10.1), so a full
    seating, once committed, is true for good."""

    invite_code: str
    creator_id: str
    people: tuple[str | None, ...]  # each seat's person id (None: empty, or a bot)
    full: bool


def seating_of(invite_code: str, creator_id: str, seats: list[Player | None]) -> Seating:
    """A table's seating from its columns."""
    return Seating(
        invite_code=invite_code,
        creator_id=creator_id,
        people=tuple(None if p is None or p.bot is not None else p.id for p in seats),
        full=all(p is not None for p in seats),
    )


async def read_seating(conn: Conn, table_id: str) -> Seating | None:
    """A table's seating as last committed, without a lock."""
    record = await conn.fetchrow(
        "SELECT invite_code, creator_id, seats::text FROM tables WHERE table_id = $1", table_id
    )
    if record is None:
        return None
    seats = _seats_decoder.decode(record["seats"])
    return seating_of(record["invite_code"], record["creator_id"], seats)


async def read_table(conn: Conn, table_id: str) -> TableRow | None:
    """The table as last committed, without a lock."""
    record = await conn.fetchrow(f"SELECT {_COLUMNS} FROM tables WHERE table_id = $1", table_id)
    return None if record is None else _row(record)


OutboxRow = tuple[str, str, bytes, str]  # exchange, routing key, body, message id


class Change(msgspec.Struct, kw_only=True):
    """Everything one command writes, saved in one statement (one round trip)."""

    row: TableRow
    envelopes: list[Envelope]
    encoded: list[bytes]  # each envelope as JSON
    outbox: list[tuple[str, str, bytes, str]]  # exchange, routing key, body, message id
    hands: list[tuple[int, bytes]] = []  # finished hands: number, record
    command_id: str | None = None
    actor: str | None = None
    result: bytes | None = None
    bot_turn_due_at: datetime | None = None  # the bot's turn is sent again then, if no move
    # The trace of the command that made it (its outbox rows carry it on), if traced.
    traceparent: str | None = None
    # Views already built for this version, by (seat, deck design): the sockets reuse them.
    views: dict[tuple[int | None, str | None], TableView] = {}


def change_of(
    table_id: str,
    envelopes: list[Envelope],
    hands: list[HandEnded],
    bot_turn: BotTurn | None,
) -> tuple[list[bytes], list[OutboxRow], list[tuple[int, bytes]]]:
    """What a change writes besides its row: each event as JSON, the outbox rows (the events
    to ``gin.events``, a bot's turn to ``gin.bots``) and the finished hands' records."""
    encoded = [_json.encode(e) for e in envelopes]
    messages = [
        (EVENTS_EXCHANGE, table_event_key(table_id, e.type), body, str(e.id))
        for e, body in zip(envelopes, encoded, strict=True)
    ]
    if bot_turn is not None:
        messages.append(bot_turn_row(bot_turn))
    return encoded, messages, [(h.hand, _json.encode(h)) for h in hands]


def bot_turn_row(turn: BotTurn, resent: str = "") -> OutboxRow:
    """The outbox row of a bot's turn (``resent`` tells a resend's message id apart; the bot's
    command id is the same every time)."""
    message_id = f"{turn.table_id}:{turn.version}:bot" + (f":{resent}" if resent else "")
    return BOTS_EXCHANGE, bot_key(turn.level), _json.encode(turn), message_id


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """A change built on a remembered row, to be saved only if that row is still the table's:
    the table still at ``version``, the mover's deck design still ``design`` (the change's
    views were built for it) and the actor's command id not used already."""

    change: Change
    version: int
    player: str | None  # None: no design to check (one read under the row's lock)
    design: str | None


# Every change of ``attempts`` that is still current, in one statement: each table's row is
# updated only if it is still at the version the change was built on, the mover's deck design
# the one its views were built for, and the actor's command id new; the rows of the others
# are written only where their table's was. Without a lock (the group commit, outside any
# transaction), a commit elsewhere since makes a change write nothing and the caller takes
# the locked way; under the row's lock (``save_change``) it is always current.
# Outbox rows keep their order (ordinality): the relay publishes a table's events by id.
# Each event's ``at`` (its month's partition of the log) is its occurred_at, and a command's
# answer is kept from the move's time (``answered_at``, for the maintenance task): both the
# service's clock, as the move's own times are.
_SAVE_IF_CURRENT = """
WITH x AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::text[],
        $6::text[], $7::bytea[], $8::int[], $9::bigint[], $10::timestamptz[],
        $11::timestamptz[], $12::text[], $13::text[], $14::text[])
        AS x(table_id, expected, player, design, seats, status, state, version, seq,
            last_move_at, bot_turn_due_at, command_id, actor, result)
), moved AS (
    UPDATE tables t SET seats = x.seats::jsonb, status = x.status, state = x.state,
        version = x.version, seq = x.seq, last_move_at = x.last_move_at,
        bot_turn_due_at = x.bot_turn_due_at
    FROM x
    WHERE t.table_id = x.table_id AND t.version = x.expected
        AND (SELECT deck_design FROM preferences p WHERE p.player_id = x.player)
            IS NOT DISTINCT FROM x.design
        AND NOT EXISTS (SELECT FROM commands c WHERE c.table_id = x.table_id
            AND c.actor = x.actor AND c.command_id = x.command_id)
    RETURNING t.table_id
), logged AS (
    INSERT INTO events (table_id, seq, type, envelope, at)
    SELECT e.table_id, e.seq, e.type, e.envelope::jsonb, e.at
    FROM unnest($15::text[], $16::bigint[], $17::text[], $18::text[], $19::timestamptz[])
        AS e(table_id, seq, type, envelope, at)
    WHERE e.table_id IN (SELECT table_id FROM moved)
), queued AS (
    INSERT INTO outbox (exchange, routing_key, body, message_id, traceparent)
    SELECT o.exchange, o.routing_key, o.body, o.message_id, o.traceparent
    FROM unnest($20::text[], $21::text[], $22::text[], $23::bytea[], $24::text[], $34::text[])
        WITH ORDINALITY AS o(table_id, exchange, routing_key, body, message_id, traceparent, n)
    WHERE o.table_id IN (SELECT table_id FROM moved)
    ORDER BY o.n
), answered AS (
    INSERT INTO commands (table_id, command_id, actor, result, answered_at)
    SELECT x.table_id, x.command_id, x.actor, x.result, x.last_move_at
    FROM x WHERE x.command_id IS NOT NULL AND x.table_id IN (SELECT table_id FROM moved)
), ended AS (
    INSERT INTO hands (table_id, hand, record)
    SELECT h.table_id, h.hand, h.record::jsonb
    FROM unnest($25::text[], $26::int[], $27::text[]) AS h(table_id, hand, record)
    WHERE h.table_id IN (SELECT table_id FROM moved)
), timed AS (
    INSERT INTO deadlines AS d (table_id, absence_seat, absence_since, absence_seq,
        expiry_since, expiry_seq)
    SELECT * FROM unnest($28::text[], $29::smallint[], $30::timestamptz[], $31::bigint[],
        $32::timestamptz[], $33::bigint[])
        AS t(table_id, absence_seat, absence_since, absence_seq, expiry_since, expiry_seq)
    WHERE t.table_id IN (SELECT table_id FROM moved)
    ON CONFLICT (table_id) DO UPDATE SET
        absence_seq = CASE
            WHEN (d.absence_seat, d.absence_since)
                IS NOT DISTINCT FROM (excluded.absence_seat, excluded.absence_since)
                AND NOT d.backfill
            THEN d.absence_seq ELSE excluded.absence_seq END,
        absence_seat = excluded.absence_seat, absence_since = excluded.absence_since,
        expiry_since = excluded.expiry_since, expiry_seq = excluded.expiry_seq,
        backfill = false
)
SELECT table_id FROM moved
"""


async def save_change(conn: Conn, change: Change) -> None:
    """Store a change of a row the caller's transaction holds locked (or has just inserted):
    its state, events, outbox messages, hand records and the command's result, in one
    statement (``save_if_current``, with the version the change was made from). The caller
    tells the relay once it has committed."""
    attempt = Attempt(change=change, version=change.row.version - 1, player=None, design=None)
    if not await save_if_current(conn, [attempt]):
        raise RuntimeError(f"table {change.row.table_id!r} moved on under its lock")


async def save_if_current(conn: Conn, attempts: list[Attempt]) -> set[str]:
    """The state, events, outbox messages, hand records, deadlines (``deadlines_of``) and
    command result of each attempt still current (``Attempt``), all in one statement (outside
    a transaction it commits on its own); the table ids of those saved."""
    moves: list[tuple[object, ...]] = []
    events: list[tuple[object, ...]] = []
    outbox: list[tuple[object, ...]] = []
    parents: list[str | None] = []  # each outbox row's traceparent ($34)
    hands: list[tuple[object, ...]] = []
    timers: list[tuple[object, ...]] = []
    for attempt in attempts:
        change = attempt.change
        row = change.row
        table_id = row.table_id
        moves.append(
            (
                table_id,
                attempt.version,
                attempt.player,
                attempt.design,
                _json.encode(row.seats).decode(),
                row.status,
                None if row.state is None else _state_encoder.encode(row.state),
                row.version,
                row.seq,
                row.last_move_at,
                change.bot_turn_due_at,
                change.command_id,
                change.actor,
                None if change.result is None else change.result.decode(),
            )
        )
        events += (
            (table_id, e.seq, e.type, body.decode(), e.occurred_at)
            for e, body in zip(change.envelopes, change.encoded, strict=True)
        )
        outbox += ((table_id, *message) for message in change.outbox)
        parents += [change.traceparent] * len(change.outbox)
        hands += ((table_id, hand, record.decode()) for hand, record in change.hands)
        due = deadlines_of(row.status, row.state, row.last_move_at, row.seq, change.envelopes)
        timers.append((table_id, *msgspec.structs.astuple(due)))
    columns = (
        *_columns(moves, 14),
        *_columns(events, 5),
        *_columns(outbox, 5),
        *_columns(hands, 3),
        *_columns(timers, 6),
        parents,
    )
    saved = await conn.fetch(_SAVE_IF_CURRENT, *columns)
    return {record[0] for record in saved}


def _columns(rows: list[tuple[object, ...]], width: int) -> list[list[object]]:
    """Rows as their columns (each the array of an ``unnest``), ``width`` of them."""
    return [list(column) for column in zip(*rows, strict=True)] or [[] for _ in range(width)]


async def take_due_bot_turns(conn: Conn, now: datetime, limit: int) -> list[TableRow]:
    """Lock the tables whose bot turn is due by ``now`` (skipping those another transaction
    holds: a move, or another replica's resend), most overdue first."""
    records = await conn.fetch(
        f"SELECT {_COLUMNS} FROM tables WHERE bot_turn_due_at <= $1"
        " ORDER BY bot_turn_due_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    return [_row(r) for r in records]


async def set_bot_turn_due(conn: Conn, table_ids: list[str], due: list[datetime | None]) -> None:
    """When each table's bot turn is due again (None: no bot turn pending)."""
    await conn.execute(
        "UPDATE tables t SET bot_turn_due_at = x.due"
        " FROM unnest($1::text[], $2::timestamptz[]) AS x(table_id, due)"
        " WHERE t.table_id = x.table_id",
        table_ids,
        due,
    )


# The months of the event log (migration 011) a table's events may be in: none before the
# month of its creation, less this margin for the clocks of the replicas that moved it
# (each event's ``at`` is its replica's clock). Without its table's row, every month.
_EVENTS_AFTER = """
SELECT envelope::text FROM events WHERE table_id = $1 AND seq > $2
    AND at >= coalesce((SELECT created_at FROM tables WHERE table_id = $1), '-infinity')
        - interval '1 day'
ORDER BY seq LIMIT $3
"""


async def events_after(conn: Conn, table_id: str, after: int, limit: int) -> list[str]:
    """The JSON envelopes of a table with seq > after, in order (only the months of the
    event log from the table's creation on are read)."""
    rows = await conn.fetch(_EVENTS_AFTER, table_id, after, limit)
    return [r[0] for r in rows]


async def hand_record(conn: Conn, table_id: str, hand: int) -> str | None:
    """A finished hand's record as JSON."""
    value: str | None = await conn.fetchval(
        "SELECT record::text FROM hands WHERE table_id = $1 AND hand = $2", table_id, hand
    )
    return value


async def deck_design(conn: Conn, player_id: str) -> str | None:
    """A player's deck design."""
    value: str | None = await conn.fetchval(
        "SELECT deck_design FROM preferences WHERE player_id = $1", player_id
    )
    return value


async def set_deck_design(conn: Conn, player_id: str, design: str) -> None:
    """Store a player's deck design."""
    await conn.execute(
        "INSERT INTO preferences (player_id, deck_design) VALUES ($1, $2)"
        " ON CONFLICT (player_id) DO UPDATE SET deck_design = EXCLUDED.deck_design",
        player_id,
        design,
    )
