"""A command's decision: what a table becomes, as a pure function of what was loaded.

``decide(row, actor, command, timing, deal, design)`` takes the table row as committed, who
sends the command, the command, the moment (``Timing``: the clock read once, with the absence
and expiry durations), a ``deal`` that shuffles a deck when the engine needs one, and the
mover's deck design; it returns the ``Decision`` (the new row, its numbered events, the
mover's view, a bot's turn) or raises a refusal: ``Rejected`` (the table's rules) or the
engine's ``IllegalAction`` (the game's). No I/O, no clock and no randomness of its own, so the
two ways a command is saved (under the row's lock, or on the remembered row in one statement)
share every rule, and the rules are tested without a database. The edge gives a refusal its
HTTP status (``services/table/http.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from services.table.deadlines import at
from services.table.store import TableRow
from shared.contracts import commands as c
from shared.contracts.api import BotTurn
from shared.contracts.envelope import Envelope, wrap
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
from shared.contracts.views import TableView
from shared.engine import IllegalAction, Timing, apply, deal, expire, new_game
from shared.engine.state import GameState
from shared.engine.view import seat_table_view
from shared.infra.auth import Identity

BOT_NAMES: dict[BotLevel, str] = {"tito": "TITO", "carmen": "CARMEN", "luna": "LUNA"}
# A shuffled deck, a salt and a lot (R3.2, R3.5), drawn only when a hand is dealt.
Deal = Callable[[], tuple[list[int], str, int]]


class Rejected(Exception):
    """A command the table's rules refuse (not the game's: ``IllegalAction``): a code, a
    message and the rule; ``services/table/http.py`` maps the code to an HTTP status."""

    def __init__(self, code: str, message: str, rule: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.rule = rule


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

    @property
    def person(self) -> str | None:
        """The person's id, if a person sends it."""
        return None if self.identity is None else self.identity.id


class Decision(msgspec.Struct, kw_only=True):
    """What one accepted command makes of a table."""

    row: TableRow  # the table after it: new version, seq, state, status and last move
    envelopes: list[Envelope]  # its events, numbered after the table's last
    hands: list[HandEnded]  # the hands it finished (their records)
    seat: int | None  # the mover's seat (None: the timer service)
    view: TableView  # what the mover sees now (the answer's ``view``)
    bot_turn: BotTurn | None  # the bot's turn, when a bot has the decision now


def check_sender(actor: Actor, cmd: c.Command) -> None:
    """Only the timer service expires a table, and it does nothing else."""
    if actor.kind == "timer" and not isinstance(cmd, c.Expire):
        raise Rejected("timer_expires_only", "the timer service only expires tables")
    if actor.kind != "timer" and isinstance(cmd, c.Expire):
        raise Rejected("not_timer", "only the timer service expires a table", "R10.3")


def seat_of(row: TableRow, actor: Actor) -> int | None:
    """The seat the actor moves for (None: the timer service), or a refusal (R10.1)."""
    if actor.kind == "timer":
        return None
    if actor.kind == "bot":
        seat = actor.seat
        player = row.seats[seat] if seat in (0, 1) else None
        if player is None or player.bot is None:
            raise Rejected("not_a_bot_seat", "that seat is not a bot's")
        return seat
    seat = row.seat_of(actor.person)
    if seat is None:
        raise Rejected("not_seated", "spectators watch and do not play", "R10.1")
    return seat


def decide(
    row: TableRow, actor: Actor, cmd: c.Command, timing: Timing, shuffle: Deal, design: str | None
) -> Decision:
    """The table after ``actor``'s ``cmd`` at ``timing.now`` (``row`` is not changed)."""
    check_sender(actor, cmd)
    seat = seat_of(row, actor)
    if cmd.expected_version is not None and cmd.expected_version != row.version:
        raise Rejected(
            "stale_version", f"the table is at version {row.version}, not {cmd.expected_version}"
        )
    after = msgspec.structs.replace(row)
    events = _apply(after, seat, cmd, timing, shuffle)
    return decision(after, events, seat, timing, design)


def sit(
    row: TableRow, player: Player, caller: str, timing: Timing, shuffle: Deal, design: str | None
) -> Decision:
    """``player`` (a person, or the creator's bot) takes the free seat: the match starts and
    the first hand is dealt (R10.1); ``caller`` sees the answer's view."""
    if row.status in ("closed", "expired"):
        raise Rejected("table_closed", "this table is closed", "R10.1")
    if row.status != "waiting":
        raise Rejected("seat_taken", "both seats are taken: you can watch this table", "R10.1")
    after = msgspec.structs.replace(row, seats=[row.seats[0], player])
    state, events = new_game(row.options, timing)
    state, dealt = _deal_if_due(state, timing, shuffle)
    after.state, after.status = state, "playing"
    return decision(
        after,
        [SeatTaken(seat=1, player=player), *events, *dealt],
        after.seat_of(caller),
        timing,
        design,
    )


def opened(row: TableRow, timing: Timing, design: str | None) -> Decision:
    """A new table (``row``, version 0, its creator in seat 0) as created (R10.1)."""
    creator = row.seats[0]
    assert creator is not None
    events: list[AnyEvent] = [
        TableCreated(options=row.options, creator=creator),
        SeatTaken(seat=0, player=creator),
    ]
    return decision(msgspec.structs.replace(row), events, 0, timing, design)


def decision(
    row: TableRow, events: list[AnyEvent], seat: int | None, timing: Timing, design: str | None
) -> Decision:
    """Number ``events`` after ``row``'s last (they occur at ``timing.now``) and give the
    row its new version and last move; the mover's view and a bot's turn."""
    now = at(timing.now)
    row.version += 1
    envelopes = []
    for event in events:
        row.seq += 1
        envelopes.append(wrap(row.table_id, row.seq, event, now, row.version))
    row.last_move_at = now
    return Decision(
        row=row,
        envelopes=envelopes,
        hands=[e for e in events if isinstance(e, HandEnded)],
        seat=seat,
        view=view(row, seat, design, timing),
        bot_turn=bot_turn(row, timing),
    )


def view(row: TableRow, seat: int | None, design: str | None, timing: Timing) -> TableView:
    """What a seat (None: a spectator) may see of a table at ``timing.now``."""
    return seat_table_view(
        row.state,
        seat,
        timing,
        table_id=row.table_id,
        version=row.version,
        status=row.status,
        seats=row.seats,
        options=row.options,
        deck_design=design,
    )


def bot_turn(row: TableRow, timing: Timing) -> BotTurn | None:
    """The bot seat's turn, when a bot has a decision (R11.4: its view only)."""
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
        view=view(row, seat, None, timing),
    )


def _apply(
    row: TableRow, seat: int | None, cmd: c.Command, timing: Timing, shuffle: Deal
) -> list[AnyEvent]:
    """Apply ``cmd`` to ``row`` (a copy, changed in place): the events it makes."""
    if row.status in ("closed", "expired"):
        raise Rejected("table_closed", "this table is closed", "R10.3")
    if row.state is None:  # waiting for an opponent
        return _apply_waiting(row, seat, cmd, timing)
    if seat is None:
        state, events = expire(row.state, timing)
    else:
        state, events = apply(row.state, seat, cmd, timing)
        other = row.seats[1 - seat]
        bot_agrees = other is not None and other.bot is not None  # R9.4
        if isinstance(cmd, c.Rematch) and bot_agrees and state.status == "match_over":
            state, more = apply(state, 1 - seat, c.Rematch(), timing)
            events += more
    state, dealt = _deal_if_due(state, timing, shuffle)
    row.state = state
    row.status = state.status  # the game statuses are table statuses too
    return [*events, *dealt]


def _apply_waiting(
    row: TableRow, seat: int | None, cmd: c.Command, timing: Timing
) -> list[AnyEvent]:
    if seat is None:  # expiry of a table nobody joined
        if timing.now - row.last_move_at.timestamp() < timing.expiry_after:
            raise IllegalAction("not_expired", "the table is not idle long enough", "R10.3")
        row.status = "expired"
        return [TableExpired()]
    if isinstance(cmd, c.Leave):  # R10.1: a creator who leaves a waiting table closes it
        row.status = "closed"
        return [TableClosed(reason="creator_left")]
    raise Rejected("waiting_for_opponent", "the match starts when both seats are taken", "R10.1")


def _deal_if_due(
    state: GameState, timing: Timing, shuffle: Deal
) -> tuple[GameState, list[AnyEvent]]:
    if not state.needs_deal:
        return state, []
    deck, salt, lot = shuffle()
    state, events = deal(state, deck, salt, lot, timing)
    return state, list(events)
