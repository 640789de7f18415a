"""CARMEN (medium): a solid greedy player that keeps its deadwood as low as it can.

She takes the upcard or the discard whenever it lowers the deadwood of her best ten (which
covers every card that forms or extends a meld), knocks as soon as she may (gin first),
and otherwise discards the card that leaves the lowest deadwood, the highest on ties.
"""

from __future__ import annotations

import random

from services.bots.strategies.knowledge import (
    NoDecision,
    card_of,
    discard,
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
from shared.engine.melds import best_discard, deadwood_points


def improves(hand: int, card: int | None) -> bool:
    """Whether taking ``card`` lowers the deadwood of the best ten cards kept."""
    if card is None:
        return False
    bit = 1 << card
    return best_discard(hand | bit, bit)[1] < deadwood_points(hand)


def decide(view: TableView, rng: random.Random) -> c.Command:
    """CARMEN's move: greedy on deadwood, knocking at the first chance."""
    if match_over(view):
        return rematch(view)
    hand = my_turn(view)
    mine = mask_of_texts(hand.my_cards or ())
    top = card_of(hand.discard_pile[-1]) if hand.discard_pile else None
    if hand.phase == "upcard":
        return c.TakeUpcard() if improves(mine, top) else c.PassUpcard()
    if hand.phase == "draw":
        pile = draw_from(view, "discard")
        if pile is not None and improves(mine, top):
            return pile
        return _stock(view)
    return end_turn(view)


def end_turn(view: TableView) -> c.Command:
    """Big gin, else the lowest knock, else the discard that leaves the lowest deadwood."""
    big = find(view, c.BigGin)
    if big is not None:
        return big
    options = knocks(view)
    if options:
        return options[0][2]
    arrangement = view.hand.my_arrangement if view.hand is not None else None
    if arrangement is None or arrangement.discard is None:
        raise NoDecision("no discard to make")
    return discard(view, card_of(arrangement.discard))


def _stock(view: TableView) -> c.Command:
    move = draw_from(view, "stock")
    if move is None:
        raise NoDecision("no draw is legal")
    return move
