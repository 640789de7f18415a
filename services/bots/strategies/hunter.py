"""The patient gin hunter: a second yardstick for tournaments only (no level, issue 35).

Written after the published descriptions of the EAAI-21 Gin Rummy challenge's strongest
entries, whose line is the opposite of the simple player's early knocks:

- the upcard or the discard is taken only when it goes into a meld at once;
- a discard is chosen by the deadwood it leaves, less the hand's outs (the unseen cards
  that would meld with what is kept), plus the danger of feeding the opponent (a card that
  melds with what the opponent took from the pile, or sits beside it);
- it knocks only in its first turns (``KNOCK_TURNS``), when an early knock is rarely
  undercut; after that it plays for gin alone, and gin is never missed.

A strong bot must beat both this player and the simple one: a bot that mostly undercuts early
knockers looks strong against the simple player and weak against a patient gin hunter.
"""

from __future__ import annotations

import random

from services.bots.strategies.knowledge import (
    STOCK_AT_DEAL,
    Knowledge,
    discard,
    discardable,
    find,
    knocks,
    match_over,
    my_turn,
    pile_or_stock,
    read,
    rematch,
)
from services.bots.strategies.outlook import REACH
from services.bots.strategies.tito import makes_meld as melds_with
from shared.contracts import commands as c
from shared.contracts.views import TableView
from shared.engine.cards import POINTS, cards_of
from shared.engine.melds import deadwood_points

KNOCK_TURNS = 4  # it knocks only within its first four turns; then it waits for gin
OUTS = 1.0  # deadwood points one out is worth
DANGER = 6.0  # deadwood points a card that melds with the opponent's taken cards costs
NEAR = 2.0  # deadwood points a card beside the opponent's taken cards costs


def decide(view: TableView, rng: random.Random) -> c.Command:
    """The gin hunter's move: melds only from the pile, early knocks only, then gin."""
    if match_over(view):
        return rematch(view)
    hand = my_turn(view)
    k = read(view)
    wants = melds_with(k.hand, k.top)
    if hand.phase == "upcard":
        return c.TakeUpcard() if wants else c.PassUpcard()
    if hand.phase == "draw":
        return pile_or_stock(view, wants)
    return end_turn(view, k)


def my_turns(k: Knowledge) -> int:
    """How many turns this seat has drawn in so far (this one included)."""
    return (STOCK_AT_DEAL - k.stock_count + 1) // 2


def end_turn(view: TableView, k: Knowledge) -> c.Command:
    """Big gin, gin, an early knock, or the cheapest discard."""
    big = find(view, c.BigGin)
    if big is not None:
        return big
    options = knocks(view)
    if options and (options[0][1] == 0 or my_turns(k) <= KNOCK_TURNS):
        return options[0][2]
    allowed = discardable(view)
    costs = {card: discard_cost(k, card) for card in range(52) if allowed >> card & 1}
    return discard(view, min(costs, key=lambda card: (costs[card], -POINTS[card], card)))


def discard_cost(k: Knowledge, card: int) -> float:
    """Deadwood left, less the outs of the cards kept, plus the danger of feeding the opponent."""
    kept = k.hand & ~(1 << card)
    dead = deadwood_points(kept)
    outs = sum(1 for other in cards_of(k.unseen & _reach_of(kept)) if melds_with(kept, other))
    taken = k.opp_known
    danger = 0.0
    if taken and melds_with(taken, card):
        danger = DANGER
    elif taken & REACH[card]:
        danger = NEAR
    return dead - OUTS * outs + danger


def _reach_of(mask: int) -> int:
    out = 0
    for card in cards_of(mask):
        out |= REACH[card]
    return out
