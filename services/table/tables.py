"""The table lifecycle around the engine: create, join, seat a bot, and every command.

Each public coroutine runs inside the caller's transaction on one connection: it locks the
table row, checks, applies the engine, and records the change (state, events with gap-free
seq, hand records, outbox rows, the command's result) before the caller commits.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec

from services.table import store
from services.table.store import TableRow
from shared.contracts import commands as c
from shared.contracts.api import BotTurn, CommandResult, TableCreatedResponse
from shared.contracts.envelope import wrap
from shared.contracts.events import (
    AnyEvent,
    BotLevel,
    HandEnded,
    Player,
    SeatTaken,
    TableClosed,
    TableCreated,
    TableExpired,
)
from shared.contracts.names import BOTS_EXCHANGE, EVENTS_EXCHANGE, bot_key, table_event_key
from shared.contracts.options import TableOptions
from shared.contracts.views import TableView
from shared.engine import IllegalAction, Timing, apply, deal, expire, new_game
from shared.engine.state import GameState
from shared.engine.view import seat_table_view
from shared.infra.auth import Identity
from shared.infra.db import Conn
from shared.infra.web import Refused

BOT_NAMES: dict[BotLevel, str] = {"tito": "TITO", "carmen": "CARMEN", "luna": "LUNA"}
_json = msgspec.json.Encoder()
Shuffle = Callable[[], tuple[list[int], str, int]]
SaveIfCurrent = Callable[[store.Attempt], Awaitable[bool]]
SEATINGS_KEPT = 100_000  # full seatings remembered per replica (some 200 bytes each)
ROWS_KEPT = 20_000  # committed rows remembered per replica (some 3 KiB each)


class Actor(msgspec.Struct, frozen=True, kw_only=True):
    """Who sends a command: a person (by identity), a bot seat, or the timer service."""

    kind: Literal["person", "bot", "timer"]
    identity: Identity | None = None
    seat: int | None = None

    @property
    def label(self) -> str:
        """How the command log names the actor."""
        if self.identity is not None:
            return f"person:{self.identity.id}"
        return f"{self.kind}:{self.seat}"


def _check_sender(actor: Actor, cmd: c.Command) -> None:
    """Only the timer service expires a table, and it does nothing else."""
    if actor.kind == "timer" and not isinstance(cmd, c.Expire):
        raise Refused(403, "timer_expires_only", "the timer service only expires tables")
    if actor.kind != "timer" and isinstance(cmd, c.Expire):
        raise Refused(403, "not_timer", "only the timer service expires a table", "R10.3")


def secure_shuffle() -> tuple[list[int], str, int]:
    """A deck from the operating system's secure source, a salt and a lot (R3.2, R3.5)."""
    deck = list(range(52))
    secrets.SystemRandom().shuffle(deck)
    return deck, secrets.token_hex(16), secrets.randbelow(2)


class Tables:
    """The table service's rules of the table, over the engine's rules of the game."""

    def __init__(
        self,
        public_url: str,
        absence_after_s: float,
        expiry_after_s: float,
        clock: Callable[[], float] = time.time,
        shuffle: Shuffle = secure_shuffle,
        bot_resend_s: float = 30.0,
        rows_kept: int = ROWS_KEPT,
    ) -> None:
        self.public_url = public_url.rstrip("/")
        self.bot_resend_after = timedelta(seconds=bot_resend_s)
        self.absence_after_s = absence_after_s
        self.expiry_after_s = expiry_after_s
        self.clock = clock
        self.shuffle = shuffle
        # Full seatings read from committed rows (true for good, R10.1), newest last.
        self.seatings: OrderedDict[str, store.Seating] = OrderedDict()
        # Committed rows and the deck designs last read, newest last (``command_at_once``).
        self.rows_kept = rows_kept
        self.rows: OrderedDict[str, TableRow] = OrderedDict()
        self.designs: OrderedDict[str, str | None] = OrderedDict()

    def timing(self) -> Timing:
        """Now, with the absence and expiry durations."""
        return Timing(self.clock(), self.absence_after_s, self.expiry_after_s)

    # --- views --------------------------------------------------------------------------

    def table_view(self, row: TableRow, seat: int | None, deck_design: str | None) -> TableView:
        """What a seat (None: a spectator) may see of a table now."""
        return seat_table_view(
            row.state,
            seat,
            self.timing(),
            table_id=row.table_id,
            version=row.version,
            status=row.status,
            seats=row.seats,
            options=row.options,
            deck_design=deck_design,
        )

    # --- the table lifecycle (R10.1) -------------------------------------------------------

    async def create(
        self, conn: Conn, identity: Identity, options: TableOptions
    ) -> tuple[TableCreatedResponse, store.Change]:
        """A new table with its creator in seat 0, waiting for an opponent."""
        now = self._now()
        creator = Player(id=identity.id, name=identity.name)
        row = TableRow(
            table_id=secrets.token_urlsafe(9),
            invite_code=secrets.token_urlsafe(16),
            creator_id=identity.id,
            options=options,
            seats=[creator, None],
            status="waiting",
            state=None,
            version=0,
            seq=0,
            created_at=now,
            last_move_at=now,
        )
        await store.insert_table(conn, row)
        events: list[AnyEvent] = [
            TableCreated(options=options, creator=creator),
            SeatTaken(seat=0, player=creator),
        ]
        change = self._change(row, events, now)
        await store.save_change(conn, change)
        design = await store.deck_design(conn, identity.id)
        created = TableCreatedResponse(
            table_id=row.table_id,
            invite_code=row.invite_code,
            invite_url=f"{self.public_url}/tables/{row.table_id}?invite={row.invite_code}",
            seat=0,
            view=self.table_view(row, 0, design),
        )
        return created, change

    async def join(
        self, conn: Conn, table_id: str, identity: Identity, code: str
    ) -> tuple[CommandResult, store.Change]:
        """Take the free seat with the invitation code; the match starts (R10.1)."""
        seating = await self.seating(conn, table_id)
        self._check_invitation(seating, identity, code)  # before the lock: a flood waits on none
        locked = await self._lock(conn, table_id, player=identity.id)
        row = locked.row
        self._check_invitation(self._remember(row), identity, code)
        if row.status in ("closed", "expired"):
            raise Refused(409, "table_closed", "this table is closed", "R10.1")
        if row.status != "waiting":
            raise Refused(
                409, "seat_taken", "both seats are taken: you can watch this table", "R10.1"
            )
        player = Player(id=identity.id, name=identity.name)
        return await self._sit(conn, row, player, identity, locked.deck_design)

    async def seat_bot(
        self, conn: Conn, table_id: str, identity: Identity, level: BotLevel
    ) -> tuple[CommandResult, store.Change]:
        """The creator fills the free seat with a bot; the match starts (R10.1)."""
        if (await self.seating(conn, table_id)).creator_id != identity.id:  # before the lock
            raise Refused(403, "not_creator", "only the table's creator seats a bot", "R10.1")
        locked = await self._lock(conn, table_id, player=identity.id)
        row = locked.row
        if row.status != "waiting":
            raise Refused(409, "seat_taken", "both seats are taken", "R10.1")
        bot = Player(name=BOT_NAMES[level], bot=level)
        return await self._sit(conn, row, bot, identity, locked.deck_design)

    async def _sit(
        self, conn: Conn, row: TableRow, player: Player, caller: Identity, design: str | None
    ) -> tuple[CommandResult, store.Change]:
        row.seats[1] = player
        timing = self.timing()
        state, events = new_game(row.options, timing)
        events = [SeatTaken(seat=1, player=player), *events]
        state, dealt = self._deal_if_due(state, timing)
        row.state = state
        row.status = "playing"
        change = self._change(row, [*events, *dealt], _at(timing.now))
        await store.save_change(conn, change)
        view = self.table_view(row, row.seat_of(caller.id), design)
        return CommandResult(version=row.version, events=change.envelopes, view=view), change

    # --- commands --------------------------------------------------------------------------

    async def command(
        self, conn: Conn, table_id: str, actor: Actor, cmd: c.Command
    ) -> tuple[bytes, store.Change | None]:
        """Apply one command in the caller's transaction: the result as JSON and the change
        (none for a repeat of a ``command_id``: it returns the first result, changes nothing)."""
        player = actor.identity.id if actor.identity else None
        _check_sender(actor, cmd)
        if player is not None:  # a spectator is refused before the lock, most often from memory
            await self._check_seated(conn, table_id, player)
        locked = await self._lock(conn, table_id, cmd.command_id, player, actor.label)
        row = locked.row
        self._remember(row)
        if player is not None:
            self._remember_design(player, locked.deck_design)
        seat = self._seat(row, actor, cmd)
        if locked.prior is not None:  # this actor's own: ids are scoped by who sends them
            return locked.prior.encode(), None
        if cmd.expected_version is not None and cmd.expected_version != row.version:
            raise Refused(
                409,
                "stale_version",
                f"the table is at version {row.version}, not {cmd.expected_version}",
            )
        timing = self.timing()
        events = self._apply(row, seat, cmd, timing)
        change = self._change(row, events, _at(timing.now))
        view = self.table_view(row, seat, locked.deck_design)
        change.views[(seat, locked.deck_design)] = view
        result = _json.encode(
            CommandResult(version=row.version, events=change.envelopes, view=view)
        )
        if cmd.command_id is not None:
            change.command_id, change.actor, change.result = cmd.command_id, actor.label, result
        await store.save_change(conn, change)
        return result, change

    # --- a command in one statement -------------------------------------------------------

    def committed(self, row: TableRow) -> None:
        """A row as just committed (never one read or changed inside an open transaction):
        a person's next command at its table may be applied to it (``command_at_once``)."""
        if self.rows_kept <= 0:
            return
        self.rows[row.table_id] = row
        self.rows.move_to_end(row.table_id)
        if len(self.rows) > self.rows_kept:
            self.rows.popitem(last=False)

    async def command_at_once(
        self, save: SaveIfCurrent, table_id: str, actor: Actor, cmd: c.Command
    ) -> tuple[bytes, store.Change] | None:
        """A person's command applied to the table's remembered row and saved by ``save``
        (``GroupCommit.save``: in one statement, outside any transaction, with others) if the
        table is still at that version (and the person's deck design as remembered); None
        when it is not for this way: nothing remembered, a refusal, a version or design moved
        on, a command_id used already, another command at the table under way. The caller
        then takes the locked way (``command``), which refuses or answers a repeated
        command_id as it always did: this way only ever applies."""
        remembered = self.rows.get(table_id)
        player = actor.identity.id if actor.identity is not None else None
        if remembered is None or player is None or player not in self.designs:
            return None
        if cmd.expected_version is not None and cmd.expected_version != remembered.version:
            return None
        design = self.designs[player]
        row = msgspec.structs.replace(remembered)  # the remembered row is never changed
        try:
            seat = self._seat(row, actor, cmd)
            timing = self.timing()
            events = self._apply(row, seat, cmd, timing)
        except (Refused, IllegalAction):
            return None
        change = self._change(row, events, _at(timing.now))
        view = self.table_view(row, seat, design)
        change.views[(seat, design)] = view
        result = _json.encode(
            CommandResult(version=row.version, events=change.envelopes, view=view)
        )
        if cmd.command_id is not None:
            change.command_id, change.actor, change.result = cmd.command_id, actor.label, result
        attempt = store.Attempt(
            change=change, version=remembered.version, player=player, design=design
        )
        if not await save(attempt):
            self.rows.pop(table_id, None)
            return None
        return result, change

    def _remember_design(self, player: str, design: str | None) -> None:
        self.designs[player] = design
        self.designs.move_to_end(player)
        if len(self.designs) > self.rows_kept:
            self.designs.popitem(last=False)

    # --- refusals before the row lock -------------------------------------------------------

    def refuse_from_memory(self, table_id: str, actor: Actor, cmd: c.Command) -> None:
        """The refusals that need no database at all: the wrong sender for the command, and
        a spectator at a table whose full seating is remembered (a flood from one costs no
        connection)."""
        _check_sender(actor, cmd)
        seating = self.seatings.get(table_id)
        person = actor.identity.id if actor.identity is not None else None
        if seating is not None and person is not None and person not in seating.people:
            raise Refused(403, "not_seated", "spectators watch and do not play", "R10.1")

    async def seating(self, conn: Conn, table_id: str) -> store.Seating:
        """A table's seating: remembered if full, else read without a lock (404 if none)."""
        seating = self.seatings.get(table_id)
        if seating is None:
            seating = await store.read_seating(conn, table_id)
            if seating is None:
                raise Refused(404, "no_such_table", f"there is no table {table_id!r}")
            self._keep(table_id, seating)
        return seating

    async def _check_seated(self, conn: Conn, table_id: str, player: str) -> None:
        # A seating not full is never remembered, so it was just read: a join made at another
        # replica a moment ago is in it.
        if player not in (await self.seating(conn, table_id)).people:
            raise Refused(403, "not_seated", "spectators watch and do not play", "R10.1")

    @staticmethod
    def _check_invitation(seating: store.Seating, identity: Identity, code: str) -> None:
        if not secrets.compare_digest(code.encode(), seating.invite_code.encode()):
            raise Refused(403, "bad_invite_code", "this invitation code is not this table's")
        if identity.id in seating.people:
            raise Refused(409, "already_seated", "you are seated at this table already", "R10.1")

    def _remember(self, row: TableRow) -> store.Seating:
        """The seating of a row read under the lock (so committed); kept once full."""
        known = self.seatings.get(row.table_id)
        if known is not None:  # full, so the row's seating is this one (R10.1)
            return known
        seating = store.seating_of(row.invite_code, row.creator_id, row.seats)
        self._keep(row.table_id, seating)
        return seating

    def _keep(self, table_id: str, seating: store.Seating) -> None:
        if not seating.full:
            return
        self.seatings[table_id] = seating
        self.seatings.move_to_end(table_id)
        if len(self.seatings) > SEATINGS_KEPT:
            self.seatings.popitem(last=False)

    def _seat(self, row: TableRow, actor: Actor, cmd: c.Command) -> int | None:
        if actor.kind == "timer":
            return None
        if actor.kind == "bot":
            seat = actor.seat
            if seat not in (0, 1) or row.seats[seat] is None or row.seats[seat].bot is None:  # type: ignore[union-attr]
                raise Refused(403, "not_a_bot_seat", "that seat is not a bot's")
            return seat
        assert actor.identity is not None
        seat = row.seat_of(actor.identity.id)
        if seat is None:
            raise Refused(403, "not_seated", "spectators watch and do not play", "R10.1")
        return seat

    def _apply(
        self, row: TableRow, seat: int | None, cmd: c.Command, timing: Timing
    ) -> list[AnyEvent]:
        if row.status in ("closed", "expired"):
            raise Refused(409, "table_closed", "this table is closed", "R10.3")
        if row.state is None:  # waiting for an opponent
            return self._apply_waiting(row, seat, cmd, timing)
        if seat is None:
            state, events = expire(row.state, timing)
        else:
            state, events = apply(row.state, seat, cmd, timing)
            other = row.seats[1 - seat]
            bot_agrees = other is not None and other.bot is not None  # R9.4
            if isinstance(cmd, c.Rematch) and bot_agrees and state.status == "match_over":
                state, more = apply(state, 1 - seat, c.Rematch(), timing)
                events += more
        state, dealt = self._deal_if_due(state, timing)
        row.state = state
        row.status = state.status  # the game statuses are table statuses too
        return [*events, *dealt]

    def _apply_waiting(
        self, row: TableRow, seat: int | None, cmd: c.Command, timing: Timing
    ) -> list[AnyEvent]:
        if seat is None:  # expiry of a table nobody joined
            if timing.now - row.last_move_at.timestamp() < timing.expiry_after:
                raise IllegalAction("not_expired", "the table is not idle long enough", "R10.3")
            row.status = "expired"
            return [TableExpired()]
        if isinstance(cmd, c.Leave):  # R10.1: a creator who leaves a waiting table closes it
            row.status = "closed"
            return [TableClosed(reason="creator_left")]
        raise Refused(
            409, "waiting_for_opponent", "the match starts when both seats are taken", "R10.1"
        )

    def _deal_if_due(self, state: GameState, timing: Timing) -> tuple[GameState, list[AnyEvent]]:
        if not state.needs_deal:
            return state, []
        deck, salt, lot = self.shuffle()
        state, events = deal(state, deck, salt, lot, timing)
        return state, list(events)

    # --- recording a change -----------------------------------------------------------------

    async def _lock(
        self,
        conn: Conn,
        table_id: str,
        command_id: str | None = None,
        player: str | None = None,
        actor: str | None = None,
    ) -> store.Locked:
        locked = await store.lock_for_command(conn, table_id, command_id, player, actor)
        if locked is None:
            raise Refused(404, "no_such_table", f"there is no table {table_id!r}")
        return locked

    def _now(self) -> datetime:
        return _at(self.clock())

    def now(self) -> datetime:
        """The service's clock, as an aware UTC datetime."""
        return self._now()

    def _change(self, row: TableRow, events: list[AnyEvent], now: datetime) -> store.Change:
        """The new version and seqs, the envelopes, hand records and outbox messages; the
        events occurred ``now``: the moment the engine applied the command (so an absence's
        ``since``, the engine's ``decision_since``, is its deciding event's ``occurred_at``)."""
        envelopes = []
        row.version += 1
        for event in events:
            row.seq += 1
            envelopes.append(wrap(row.table_id, row.seq, event, now, row.version))
        row.last_move_at = now
        encoded = [_json.encode(e) for e in envelopes]
        messages = [
            (EVENTS_EXCHANGE, table_event_key(row.table_id, e.type), body, str(e.id))
            for e, body in zip(envelopes, encoded, strict=True)
        ]
        turn = self.bot_turn_message(row)
        if turn is not None:
            messages.append(turn)
        hands = [(e.hand, _json.encode(e)) for e in events if isinstance(e, HandEnded)]
        return store.Change(
            row=row,
            envelopes=envelopes,
            encoded=encoded,
            outbox=messages,
            hands=hands,
            bot_turn_due_at=None if turn is None else now + self.bot_resend_after,
        )

    def bot_turn_message(self, row: TableRow, resent: str = "") -> store.OutboxRow | None:
        """The outbox row of the bot's turn at this version, if a bot has the turn (``resent``
        tells a resend's message id apart; the bot's command id is the same every time)."""
        turn = self._bot_turn(row)
        if turn is None:
            return None
        message_id = f"{row.table_id}:{row.version}:bot" + (f":{resent}" if resent else "")
        return BOTS_EXCHANGE, bot_key(turn.level), _json.encode(turn), message_id

    def _bot_turn(self, row: TableRow) -> BotTurn | None:
        """The bot seat's turn message, when a bot has a decision (R11.4: its view only)."""
        state = row.state
        if state is None or state.hand is None or row.status != "playing":
            return None
        seat = state.hand.to_act
        player = row.seats[seat]
        if player is None or player.bot is None:
            return None
        return BotTurn(
            table_id=row.table_id,
            seat=seat,
            level=player.bot,
            version=row.version,
            view=self.table_view(row, seat, None),
        )


def _at(timestamp: float) -> datetime:
    """A clock reading as an aware UTC datetime."""
    return datetime.fromtimestamp(timestamp, UTC)
