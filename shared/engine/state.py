"""The engine's state: plain frozen values, stored as they are by the table service.

Cards are ints (``cards.py``) and a hand of cards is a 52-bit mask. Nothing here computes:
the rules live in ``game.py``; what one seat may see lives in ``view.py``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.contracts.events import DealerReason, HandEnded, MatchEnded
from shared.contracts.options import TableOptions

Phase = Literal["upcard", "draw", "discard"]
GameStatus = Literal["playing", "match_over", "closed", "expired"]
NO_CARD = -1
NO_SEAT = -1  # the upcard was turned by the deal, not discarded by a seat
HAND_SIZE = 10
STOCK_START = 21  # 20 dealt cards and the upcard come first in the deck order


class Timing(msgspec.Struct, frozen=True):
    """The time of an action and the two durations of docs/RULES.md R10.2 and R10.3, in seconds."""

    now: float
    absence_after: float = 48 * 3600.0
    expiry_after: float = 7 * 86400.0


class HandState(msgspec.Struct, frozen=True, kw_only=True):
    """One hand in progress. ``deck`` fixes everything chance decides about it."""

    number: int
    dealer: int
    reason: DealerReason
    deck: tuple[int, ...]
    salt: str
    knock_limit: int
    hands: tuple[int, int]
    known: tuple[int, int]  # cards each seat took from the discard pile and still holds
    discard_pile: tuple[int, ...]  # bottom first
    discarded_by: tuple[int, ...] = (NO_SEAT,)  # who put each card of the pile there
    passed: tuple[int, int] = (0, 0)  # discard-pile tops each seat declined (public memory)
    stock_drawn: int = 0
    phase: Phase = "upcard"
    to_act: int
    upcard_passes: int = 0
    stock_only: bool = False  # both passed the upcard: the first draw is from the stock (R4.4)
    taken: int = NO_CARD  # the card taken from the discard pile this turn (R5.3)

    @property
    def stock_count(self) -> int:
        """Cards left in the stock."""
        return len(self.deck) - STOCK_START - self.stock_drawn


class GameScore(msgspec.Struct, frozen=True, kw_only=True):
    """One of a Hollywood match's three games (R9.6): points, boxes, and its winner once closed."""

    scores: tuple[int, int] = (0, 0)
    boxes: tuple[int, int] = (0, 0)  # hands whose points went into this game (R9.8)
    winner: int | None = None  # set when the game closed (R9.9)

    @property
    def closed(self) -> bool:
        """True once a player reached the target in this game."""
        return self.winner is not None


class GameState(msgspec.Struct, frozen=True, kw_only=True):
    """A table's game: the current match (and its rematches), scores and the hand on."""

    options: TableOptions
    match: int = 1
    status: GameStatus = "playing"
    scores: tuple[int, int] = (0, 0)  # Hollywood: the three games' points added up
    hands_won: tuple[int, int] = (0, 0)  # Hollywood: every hand won, scored or not (R9.7)
    games: tuple[GameScore, ...] = ()  # Hollywood only: the three games (R9.6)
    hands_dealt: int = 0
    hand: HandState | None = None
    next_dealer: int | None = None  # None: by lot
    next_reason: DealerReason = "lot"
    last_hand: HandEnded | None = None
    result: MatchEnded | None = None
    rematch_offers: tuple[bool, bool] = (False, False)
    decision_since: float  # when the seat to act got the decision (R10.2)
    last_move_at: float  # when a game command was last accepted (R10.3)

    @property
    def needs_deal(self) -> bool:
        """True when the next step is chance's: the caller deals a shuffled deck."""
        return self.status == "playing" and self.hand is None
