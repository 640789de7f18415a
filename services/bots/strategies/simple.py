"""The classic simple baseline of the Gin Rummy literature, for tournaments only (no level).

It knocks as soon as it can, discards the unmatched card of highest value, and takes the
upcard or the discard only when that card makes a meld. Published Monte Carlo bots are
measured against this player.
"""

from __future__ import annotations

import random

from services.bots.strategies.carmen import end_turn
from services.bots.strategies.knowledge import (
    NoDecision,
    card_of,
    draw_from,
    mask_of_texts,
    match_over,
    my_turn,
    rematch,
)
from services.bots.strategies.tito import makes_meld
from shared.contracts import commands as c
from shared.contracts.views import TableView


def decide(view: TableView, rng: random.Random) -> c.Command:
    """The simple player's move: melds only from the pile, knock at once, throw high."""
    if match_over(view):
        return rematch(view)
    hand = my_turn(view)
    mine = mask_of_texts(hand.my_cards or ())
    top = card_of(hand.discard_pile[-1]) if hand.discard_pile else None
    wants = makes_meld(mine, top)
    if hand.phase == "upcard":
        return c.TakeUpcard() if wants else c.PassUpcard()
    if hand.phase == "draw":
        pile = draw_from(view, "discard")
        move = pile if wants and pile is not None else draw_from(view, "stock")
        if move is None:
            raise NoDecision("no draw is legal")
        return move
    return end_turn(view)
