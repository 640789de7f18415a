"""TITO (easy): a beginner who plays legal, plausible moves and makes a beginner's mistakes.

He mostly draws from the stock, sometimes takes a discard that makes a meld, usually throws
his highest unmatched card but sometimes another unmatched one, never breaks a made meld
while an unmatched card is left, always goes gin and knocks when he can only some of the time.
"""

from __future__ import annotations

import random

from services.bots.strategies.knowledge import (
    NoDecision,
    card_of,
    discard,
    discardable,
    draw_from,
    find,
    knocks,
    mask_of_texts,
    match_over,
    my_turn,
    rematch,
)
from shared.contracts import commands as c
from shared.contracts.views import TableView
from shared.engine.cards import POINTS, cards_of
from shared.engine.melds import best_arrangement, deadwood_points

TAKE_MELD = 0.5  # how often he notices that a discard makes a meld
KNOCK = 0.5  # how often he knocks when he may (gin is never missed)
HIGHEST = 0.6  # how often he throws his highest unmatched card


def makes_meld(hand: int, card: int | None) -> bool:
    """Whether ``card`` goes into a meld with the cards of ``hand``."""
    if card is None:
        return False
    return deadwood_points(hand | 1 << card) < deadwood_points(hand) + POINTS[card]


def decide(view: TableView, rng: random.Random) -> c.Command:
    """TITO's move: weak but never absurd."""
    if match_over(view):
        return rematch(view)
    hand = my_turn(view)
    mine = mask_of_texts(hand.my_cards or ())
    top = card_of(hand.discard_pile[-1]) if hand.discard_pile else None
    wants = makes_meld(mine, top) and rng.random() < TAKE_MELD
    if hand.phase == "upcard":
        return c.TakeUpcard() if wants else c.PassUpcard()
    if hand.phase == "draw":
        pile = draw_from(view, "discard")
        stock = draw_from(view, "stock")
        move = pile if wants and pile is not None else stock
        if move is None:
            raise NoDecision("no draw is legal")
        return move
    return end_turn(view, mine, rng)


def end_turn(view: TableView, mine: int, rng: random.Random) -> c.Command:
    """Big gin and gin always; a knock half the time; else an unmatched card."""
    big = find(view, c.BigGin)
    if big is not None:
        return big
    options = knocks(view)
    if options and (options[0][1] == 0 or rng.random() < KNOCK):
        return options[0][2]
    return discard(view, _throw(view, mine, rng))


def _throw(view: TableView, mine: int, rng: random.Random) -> int:
    """An unmatched card: usually the highest, sometimes any; a meld card only if none."""
    allowed = discardable(view)
    unmatched = [int(x) for x in best_arrangement(cards_of(mine)).deadwood if allowed >> x & 1]
    if not unmatched:
        arrangement = view.hand.my_arrangement if view.hand is not None else None
        if arrangement is not None and arrangement.discard is not None:
            return card_of(arrangement.discard)
        return int(cards_of(allowed)[0])
    if rng.random() < HIGHEST:
        high = max(POINTS[x] for x in unmatched)
        unmatched = [x for x in unmatched if POINTS[x] == high]
    return rng.choice(unmatched)
