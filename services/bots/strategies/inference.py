"""What the opponent holds: weights on the unseen cards and sampled opponent hands.

Every card the opponent took from the pile says it wanted that card's neighbours (the other
cards of its rank, the next ranks of its suit); every card it discarded or declined says it
did not. The weights start at one and are multiplied by those hints. A sampled hand is the
opponent's known cards plus hidden ones drawn by weight; to model a hand that has been
improving for several turns, a few extra cards are drawn and the worst ones dropped again,
as a player keeping its best ten would.
"""

from __future__ import annotations

import random

from services.bots.strategies.knowledge import STOCK_AT_DEAL, Knowledge
from shared.engine.cards import cards_of
from shared.engine.melds import best_discard, deadwood_points

TOOK = (1.6, 1.25)  # the neighbours of a card it took: rank mates and next ranks, ranks 2 away
DROPPED = (0.65, 0.85)  # the neighbours of a card it discarded
DECLINED = (0.8, 0.95)  # the neighbours of a pile top it passed on
DEVELOP = 1.0  # extra cards drawn and dropped again per stock draw of the opponent ...
DEVELOP_CAP = 3  # ... up to this many
REDRAWS = 2  # draws of a hand it would have knocked with, before one is kept


def _neighbours(card: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The cards that meld most directly with ``card``, and those two ranks away in its suit."""
    rank, suit = card % 13, card // 13
    near = [s * 13 + rank for s in range(4) if s != suit]
    near += [card + d for d in (-1, 1) if 0 <= rank + d < 13]
    far = tuple(card + d for d in (-2, 2) if 0 <= rank + d < 13)
    return tuple(near), far


NEIGHBOURS = tuple(_neighbours(card) for card in range(52))


def opponent_weights(k: Knowledge) -> list[float]:
    """A weight per card (52): how likely each unseen card is to be in the opponent's hand."""
    weights = [1.0 if k.unseen >> card & 1 else 0.0 for card in range(52)]
    for hints, (near_factor, far_factor) in (
        (k.opp_known, TOOK),
        (k.opp_discards, DROPPED),
        (k.opp_passed & ~k.opp_discards, DECLINED),
    ):
        for card in cards_of(hints):
            near, far = NEIGHBOURS[card]
            for x in near:
                weights[x] *= near_factor
            for x in far:
                weights[x] *= far_factor
    return weights


def held_chances(k: Knowledge, weights: list[float]) -> list[float]:
    """The chance (52) that the opponent holds each unseen card, from the weights alone."""
    total = sum(weights)
    if total <= 0 or k.opp_hidden <= 0:
        return [0.0] * 52
    scale = k.opp_hidden / total
    return [min(1.0, w * scale) for w in weights]


def sample_hands(
    k: Knowledge,
    weights: list[float],
    rng: random.Random,
    count: int,
    develop: float = DEVELOP,
    cap: int = DEVELOP_CAP,
) -> list[int]:
    """``count`` plausible opponent hands (masks of all its cards, known ones included).

    A hand the opponent could have knocked with is redrawn (up to ``REDRAWS`` times) once the
    opponent has ended a turn without knocking: most players knock when they can.
    """
    pool = [card for card in range(52) if weights[card] > 0]
    hidden = max(0, min(k.opp_hidden, len(pool)))
    extra = min(round(develop * k.opp_stock_draws), cap, len(pool) - hidden)
    inverse = [1.0 / weights[card] for card in pool]
    would_have_knocked = k.knock_limit if k.stock_count < STOCK_AT_DEAL - 1 else -1
    hands = []
    for _ in range(count):
        for _ in range(REDRAWS + 1):
            mask = _draw_hand(k, pool, inverse, hidden, extra, rng)
            if deadwood_points(mask) > would_have_knocked:
                break
        hands.append(mask)
    return hands


def _draw_hand(
    k: Knowledge, pool: list[int], inverse: list[float], hidden: int, extra: int, rng: random.Random
) -> int:
    """One hand: the known cards, ``hidden + extra`` drawn by weight, the worst ``extra`` out."""
    # Efraimidis-Spirakis: the smallest keys -log(u) / w are a weighted draw without replacement.
    keyed = sorted(zip([rng.expovariate(1.0) * inv for inv in inverse], pool, strict=True))
    mask = k.opp_known
    for _, card in keyed[: hidden + extra]:
        mask |= 1 << card
    for _ in range(extra):
        card, _dead = best_discard(mask, k.opp_known)
        mask &= ~(1 << card)
    return mask
