"""The pure Selminha Gin Rummy engine: cards, melds, layoffs, the match, and views.

No I/O, no clock, no randomness of its own: the caller passes the deck and the time.
"""

from shared.engine.cards import CARDS, Card, parse_card, parse_cards
from shared.engine.errors import IllegalAction
from shared.engine.game import (
    absence_allowed,
    apply,
    deal,
    deck_commitment,
    expire,
    expiry_due,
    knock_limit,
    new_game,
    to_act,
)
from shared.engine.layoffs import Layoffs, best_layoffs
from shared.engine.melds import Arrangement, best_arrangement, best_discard, is_meld
from shared.engine.state import GameState, HandState, Timing
from shared.engine.view import hand_view, legal, match_view, my_arrangement, seat_table_view, view

__all__ = [
    "CARDS",
    "Arrangement",
    "Card",
    "GameState",
    "HandState",
    "IllegalAction",
    "Layoffs",
    "Timing",
    "absence_allowed",
    "apply",
    "best_arrangement",
    "best_discard",
    "best_layoffs",
    "deal",
    "deck_commitment",
    "expire",
    "expiry_due",
    "hand_view",
    "is_meld",
    "knock_limit",
    "legal",
    "match_view",
    "my_arrangement",
    "new_game",
    "parse_card",
    "parse_cards",
    "seat_table_view",
    "to_act",
    "view",
]
