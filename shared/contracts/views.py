"""Views: what one seat, or a spectator, may see of a table (docs/RULES.md section 11).

The engine builds ``MatchView`` and ``HandView`` from its state; the table service wraps them
in a ``TableView``. A spectator's view has no ``my_*`` fields and no ``legal``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.contracts.commands import AnyCommand
from shared.contracts.events import GameColumn, HandEnded, MatchEnded, Player
from shared.contracts.options import TableOptions

HandPhase = Literal["upcard", "draw", "discard"]
TableStatus = Literal["waiting", "playing", "match_over", "closed", "expired"]


class ArrangementView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The server's ORGANIZAR / SOBRA: melds, deadwood and points (R2.5).

    With 11 cards it is the arrangement of the best 10 and ``discard`` is the card that
    leaves them.
    """

    melds: list[list[str]]
    deadwood: list[str]
    points: int
    discard: str | None = None


class HandView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The hand in progress as one seat (or a spectator) sees it."""

    number: int
    phase: HandPhase
    to_act: int
    dealer: int
    knock_limit: int
    stock_count: int
    discard_pile: list[str]
    stock_only: bool
    card_counts: list[int]
    known: list[list[str]]
    discarded_by: list[int] = []  # the seat that discarded each card of the pile (-1: upcard)
    passed: list[list[str]] = []  # per seat, discard-pile tops it declined this hand
    opponent_card_count: int | None = None
    opponent_known: list[str] | None = None
    my_cards: list[str] | None = None
    my_arrangement: ArrangementView | None = None


class MatchView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The match: scores, hands won, the dealer, the last hand's record and the result."""

    number: int
    scores: list[int]
    hands_won: list[int]
    dealer: int | None
    rematch_offers: list[int]
    last_hand: HandEnded | None = None
    result: MatchEnded | None = None
    games: list[GameColumn] | None = None  # Hollywood tables only: the three columns (R9.11)


class TableView(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the caller may see of a table now (docs/DESIGN.md section 7)."""

    table_id: str
    version: int
    status: TableStatus
    you: int | None
    seats: list[Player | None]
    options: TableOptions
    deck_design: str | None
    match: MatchView | None
    hand: HandView | None
    legal: list[AnyCommand]
