"""Events: what happened at a table, in the past tense. One Struct per event type.

These are the ``data`` of the envelope (``envelope.py``) and are public: no event carries a
card hidden from anyone at that moment (docs/RULES.md section 11) until the hand-end reveal.
New fields get defaults; a field's type never changes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from shared.contracts.options import TableOptions

DealerReason = Literal[
    "lot", "won_previous_hand", "lost_previous_hand", "alternate", "dead_hand_redeal"
]
HandEnding = Literal["knock", "undercut", "gin", "big_gin", "dead_hand", "abandoned"]
MatchEnding = Literal["target", "resigned", "left", "absence", "expired"]
# "expired": no longer sent (an expiry is ``table_expired``, match or not); older events have it.
CloseReason = Literal["rematch_declined", "creator_left", "left", "expired"]
BotLevel = Literal["tito", "carmen", "luna"]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event."""


class Player(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who sits in a seat: a person (``id``, ``name``) or a bot (``bot`` level)."""

    name: str
    id: str | None = None
    bot: BotLevel | None = None


class TableCreated(Event, tag="table_created", frozen=True, kw_only=True):
    """A player created a table and sits in seat 0."""

    options: TableOptions
    creator: Player


class SeatTaken(Event, tag="seat_taken", frozen=True, kw_only=True):
    """A person or a bot took a seat."""

    seat: int
    player: Player


class MatchStarted(Event, tag="match_started", frozen=True, kw_only=True):
    """Both seats are taken (or a rematch was agreed): a match to the target begins."""

    match: int
    options: TableOptions


class HandStarted(Event, tag="hand_started", frozen=True, kw_only=True):
    """A hand was dealt (R3.4): who deals and why, the upcard and the deck commitment."""

    match: int
    hand: int
    dealer: int
    reason: DealerReason
    upcard: str
    stock_count: int
    knock_limit: int
    deck_commitment: str


class UpcardTaken(Event, tag="upcard_taken", frozen=True, kw_only=True):
    """A seat took the upcard (R4.3)."""

    hand: int
    seat: int
    card: str


class UpcardPassed(Event, tag="upcard_passed", frozen=True, kw_only=True):
    """A seat passed the upcard; after both passes ``reason`` says the stock must be drawn."""

    hand: int
    seat: int
    reason: Literal["both_passed_upcard"] | None = None


class CardDrawn(Event, tag="card_drawn", frozen=True, kw_only=True):
    """A seat drew a card; ``card`` only when it came from the discard pile (R11.3)."""

    hand: int
    seat: int
    source: Literal["stock", "discard"]
    card: str | None = None
    stock_count: int


class CardDiscarded(Event, tag="card_discarded", frozen=True, kw_only=True):
    """A seat discarded a card face up."""

    hand: int
    seat: int
    card: str


class StockLow(Event, tag="stock_low", frozen=True, kw_only=True):
    """The stock is down to 4 cards (R8.3)."""

    hand: int
    stock_count: int


class SeatHand(msgspec.Struct, frozen=True, kw_only=True):
    """One seat's cards at the end of a hand, laid out."""

    seat: int
    cards: list[str]
    melds: list[list[str]]
    deadwood: list[str]
    points: int


class LaidOff(msgspec.Struct, frozen=True, kw_only=True):
    """A card laid off (AJUNTOU): by which seat, on which of the knocker's melds (index)."""

    card: str
    meld: int
    by: int


class SeatTally(msgspec.Struct, frozen=True, kw_only=True):
    """One seat's final tally (R9.2), of a match or of one Hollywood game (R9.9).

    In a Hollywood match's summed tally ``hands_won`` is the boxes of the three games.
    """

    points: int
    hands_won: int
    game_bonus: int
    box_bonus: int
    total: int


class GameColumn(msgspec.Struct, frozen=True, kw_only=True):
    """One of a Hollywood match's three games (R9.6 to R9.12): its column on the score sheet.

    ``boxes``: per seat, the hands whose points went into this game. ``tally`` once it closed.
    """

    game: int  # 1, 2 or 3
    scores: list[int]
    boxes: list[int]
    closed: bool = False
    winner: int | None = None
    tally: list[SeatTally] | None = None


class HandEnded(Event, tag="hand_ended", frozen=True, kw_only=True):
    """The end-of-hand record: both hands revealed, layoffs, points, totals, the deck (R7.4).

    At a Hollywood table (R9.6 to R9.11) ``scored_in`` lists the games (1 to 3) the winner's
    points went into (empty when those games had closed, or nobody won) and ``games`` is the
    three columns after the hand; ``scores`` is then the three games' points added up. Both
    are null at other tables.
    """

    match: int
    hand: int
    how: HandEnding
    winner: int | None
    points: int
    knocker: int | None = None
    knock_discard: str | None = None
    knock_discard_chosen_by_server: bool = False
    seats: list[SeatHand]
    layoffs: list[LaidOff]
    scores: list[int]
    hands_won: list[int]
    deck: list[str]
    salt: str
    # Hollywood only (R9.7, R9.11): the games this hand's points went into, the columns after it
    scored_in: list[int] | None = None
    games: list[GameColumn] | None = None


class MatchEnded(Event, tag="match_ended", frozen=True, kw_only=True):
    """A match ended: by reaching the target, by resignation, leaving, absence or expiry.

    At a Hollywood table ``games`` is the three columns, each with its own tally, and
    ``tally`` their sum; the target is reached when the third game closes (R9.11, R9.12).
    """

    match: int
    winner: int | None
    reason: MatchEnding
    by: int | None = None
    tally: list[SeatTally]
    games: list[GameColumn] | None = None  # Hollywood only: the three columns (R9.11)


class RematchOffered(Event, tag="rematch_offered", frozen=True, kw_only=True):
    """A seat asked for (or agreed to) a rematch."""

    match: int
    seat: int


class RematchAccepted(Event, tag="rematch_accepted", frozen=True, kw_only=True):
    """Both seats agreed: a new match starts at the same table (R9.4)."""

    match: int


class AbsenceClaimable(Event, tag="absence_claimable", frozen=True, kw_only=True):
    """The seat to act has been away past the absence time: the other may claim (R10.2).

    A ``timer`` stream event; ``table_seq`` is the table event that gave the seat its decision
    (at ``since``).
    """

    seat: int
    since: datetime
    table_seq: int | None = None


ReminderKind = Literal["waiting", "claimable"]


class TurnReminder(Event, tag="turn_reminder", frozen=True, kw_only=True):
    """The seat to act has had its decision for a while: a notifier's cue (issue 33).

    A ``timer`` stream event, sent by the timer service ``after_s`` into a turn: ``waiting`` at
    each of ``GIN_TURN_REMINDERS_S``, ``claimable`` once the absence time has passed (right
    after ``absence_claimable``: the other seat may now claim the match, R10.2). ``since`` is
    when the seat got the decision (by the table event ``table_seq``), ``waited_s`` how long
    it had waited when the reminder went, ``claimable_at`` when (or since when) the other seat
    may claim. A reminder whose next one was due already when it went (the timers were down
    across both) is not sent: the later one says more.
    """

    seat: int
    since: datetime
    waited_s: float
    claimable_at: datetime
    reminder: ReminderKind
    after_s: float
    table_seq: int | None = None


class TableExpired(Event, tag="table_expired", frozen=True, kw_only=True):
    """No command was accepted for the expiry time: the table closed (R10.3).

    The one expiry event, whether or not a match had started (a match on ends first, with
    ``match_ended`` reason ``expired``).
    """


class TableClosed(Event, tag="table_closed", frozen=True, kw_only=True):
    """The table closed and takes no more commands."""

    reason: CloseReason


class PlayerErased(Event, tag="player_erased", frozen=True, kw_only=True):
    """The person of a seat had their data erased (LGPD art. 18): the seat shows a pseudonym.

    ``player`` is the pseudonym: "Jogador removido" and an ``erased-...`` id linked to nobody.
    A ``table`` stream event, one at each table the person sat at, after any other (even
    ``table_closed``); a match they were in was ended first as if they had left. It names the
    seat, never the person: a subscriber that kept who sat there (from ``seat_taken`` or
    ``table_created``) erases that person's data it holds and shows ``player`` instead; one
    that kept nothing has nothing to erase.
    """

    seat: int
    player: Player


class MessagePosted(Event, tag="message_posted", frozen=True, kw_only=True):
    """A seated player wrote in the table's chat (R10.5)."""

    message_id: int
    seat: int
    name: str
    text: str


AnyEvent = (
    TableCreated
    | SeatTaken
    | MatchStarted
    | HandStarted
    | UpcardTaken
    | UpcardPassed
    | CardDrawn
    | CardDiscarded
    | StockLow
    | HandEnded
    | MatchEnded
    | RematchOffered
    | RematchAccepted
    | AbsenceClaimable
    | TurnReminder
    | TableExpired
    | TableClosed
    | PlayerErased
    | MessagePosted
)
EVENT_TYPES: dict[str, type[Event]] = {cls.__struct_config__.tag: cls for cls in AnyEvent.__args__}
