"""What the opponent holds: weights on the unseen cards and sampled opponent hands.

Every card the opponent took from the pile says it wanted that card's neighbours (the other
cards of its rank, the next ranks of its suit); every card it discarded or declined says it
did not. The weights start at one and are multiplied by those hints. A sampled hand is the
opponent's known cards plus hidden ones drawn by weight; to model a hand that has been
improving for several turns, a few extra cards are drawn and the worst ones dropped again,
as a player keeping its best ten would.

Then the sampled hands are weighed against what the opponent did (importance resampling):
a player takes a pile top that melds with its hand and does not throw a card that melds, so
a hand with which a card it declined or threw would have made a meld is kept with a much
lower weight (``MELDED_HINT``). Per-card weights cannot say "not two cards that meld with
this one"; a whole sampled hand can.
"""

from __future__ import annotations

import math
import random

from services.bots.strategies.knowledge import STOCK_AT_DEAL, Knowledge
from services.bots.strategies.outlook import Effort
from shared.engine.cards import POINTS, cards_of
from shared.engine.melds import best_discard, best_meld_masks, deadwood_points, discard_order

TOOK = (1.6, 1.25)  # the neighbours of a card it took: rank mates and next ranks, ranks 2 away
DROPPED = (0.65, 0.85)  # the neighbours of a card it discarded
DECLINED = (0.8, 0.95)  # the neighbours of a pile top it passed on
DEVELOP = 1.0  # extra cards drawn and dropped again per stock draw of the opponent ...
DEVELOP_CAP = 3  # ... up to this many
REDRAWS = 2  # draws of a hand it would have knocked with, before one is kept
MELDED_HINT = 0.05  # the likelihood of a hand with which a card it declined or threw melds
OVERSAMPLE = 3  # hands drawn per hand kept, when hints reweight them
TOOK_HINT = True  # weigh hands by whether the cards it took from the pile meld in them
REGRET_SCALE = 2.0  # deadwood points a player's last discard gives away, about (0: ignored)
MIN_SAMPLES = 24  # hands drawn whatever the decision's budget
REGRET_SEARCHES = 8  # meld searches a hand's regret costs, about


def _neighbours(card: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The cards that meld most directly with ``card``, and those two ranks away in its suit."""
    rank, suit = card % 13, card // 13
    near = [s * 13 + rank for s in range(4) if s != suit]
    near += [card + d for d in (-1, 1) if 0 <= rank + d < 13]
    far = tuple(card + d for d in (-2, 2) if 0 <= rank + d < 13)
    return tuple(near), far


NEIGHBOURS = tuple(_neighbours(card) for card in range(52))


def _meld_partners(card: int) -> tuple[int, tuple[int, ...]]:
    """The other cards of ``card``'s rank, and each pair of its suit it would make a run with."""
    rank, suit = card % 13, card // 13
    mates = sum(1 << (s * 13 + rank) for s in range(4) if s != suit)
    pairs = tuple(
        1 << (card + a) | 1 << (card + b)
        for a, b in ((-2, -1), (-1, 1), (1, 2))
        if rank + a >= 0 and rank + b < 13
    )
    return mates, pairs


PARTNERS = tuple(_meld_partners(card) for card in range(52))


def melds_with(card: int, hand: int) -> bool:
    """Whether ``card`` would make a meld (or join one) with two cards of ``hand``."""
    mates, pairs = PARTNERS[card]
    if (hand & mates).bit_count() >= 2:
        return True
    return any(hand & pair == pair for pair in pairs)


def hint_likelihood(k: Knowledge, hand: int, hint: float = MELDED_HINT) -> float:
    """How well a sampled opponent hand agrees with the pile tops it declined and the cards
    it threw: a player rarely passes on, or throws, a card that melds with its hand."""
    likelihood = 1.0
    for card in cards_of((k.opp_passed | k.opp_discards) & ~k.opp_known):
        if melds_with(card, hand):
            likelihood *= hint
    if TOOK_HINT:
        for card in cards_of(k.opp_known):
            if not melds_with(card, hand & ~(1 << card)):
                likelihood *= hint
    thrown = k.opp_last_discard
    if thrown is not None and REGRET_SCALE > 0:
        likelihood *= math.exp(-discard_regret(hand, thrown, k.opp_known) / REGRET_SCALE)
    return likelihood


def discard_regret(hand: int, thrown: int, forbidden: int = 0) -> int:
    """How much lower ``hand``'s deadwood would be had its owner kept ``thrown`` and thrown
    another card instead (0: ``thrown`` was a best discard of the eleven)."""
    kept = deadwood_points(hand)
    whole = hand | 1 << thrown
    whole_dead = deadwood_points(whole)
    best = kept
    for card in sorted(cards_of(hand & ~forbidden), key=POINTS.__getitem__, reverse=True):
        if whole_dead - POINTS[card] >= best:
            break  # throwing a card saves at most its value, and values only fall from here
        dead = deadwood_points(whole & ~(1 << card))
        if dead < best:
            best = dead
    return kept - best


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
    eager: float = 1.0,
    effort: Effort | None = None,
) -> list[int]:
    """``count`` plausible opponent hands (masks of all its cards, known ones included).

    A hand the opponent could have knocked with is redrawn (up to ``REDRAWS`` times) once the
    opponent has ended a turn without knocking, with the chance ``eager`` that it is a player
    who knocks as soon as it can. When it has declined or thrown cards, ``OVERSAMPLE`` times as
    many hands are drawn and ``count`` of them kept by their ``hint_likelihood``. Once
    ``effort`` is spent, drawing stops (at ``MIN_SAMPLES`` at least) and fewer hands come back.
    """
    effort = Effort.unlimited() if effort is None else effort
    pool = [card for card in range(52) if weights[card] > 0]
    hidden = max(0, min(k.opp_hidden, len(pool)))
    extra = min(round(develop * k.opp_stock_draws), cap, len(pool) - hidden)
    inverse = [1.0 / weights[card] for card in pool]
    would_have_knocked = k.knock_limit if k.stock_count < STOCK_AT_DEAL - 1 else -1
    hinted = k.opp_passed | k.opp_discards | k.opp_known
    drawn = count * OVERSAMPLE if hinted and OVERSAMPLE > 1 else count
    hands: list[int] = []
    for _ in range(drawn):
        if effort.exhausted and len(hands) >= MIN_SAMPLES:
            break
        redraws = REDRAWS if eager >= 1.0 or rng.random() < eager else 0
        for _ in range(redraws + 1):
            mask = _draw_hand(k, pool, inverse, hidden, extra, rng, effort)
            effort.spend()  # the knock check
            if deadwood_points(mask) > would_have_knocked:
                break
        hands.append(mask)
    if drawn == count:
        return hands
    effort.spend(REGRET_SEARCHES * len(hands))
    likelihoods = [hint_likelihood(k, hand, MELDED_HINT) for hand in hands]
    kept = count if len(hands) == drawn else max(MIN_SAMPLES, len(hands) // OVERSAMPLE)
    return rng.choices(hands, weights=likelihoods, k=kept)


def _draw_hand(
    k: Knowledge,
    pool: list[int],
    inverse: list[float],
    hidden: int,
    extra: int,
    rng: random.Random,
    effort: Effort,
) -> int:
    """One hand: the known cards, ``hidden + extra`` drawn by weight, the worst ``extra`` out."""
    # Efraimidis-Spirakis: the smallest keys -log(u) / w are a weighted draw without replacement.
    keyed = sorted(zip([rng.expovariate(1.0) * inv for inv in inverse], pool, strict=True))
    mask = k.opp_known
    for _, card in keyed[: hidden + extra]:
        mask |= 1 << card
    if extra:
        mask = _keep_best(mask, extra, k.opp_known, effort)
    return mask


def _keep_best(mask: int, extra: int, known: int, effort: Effort) -> int:
    """``mask`` less its ``extra`` worst cards, as ``extra`` best discards would leave it: the
    highest loose cards of its best melds (one meld search; dropping a loose card leaves those
    melds best), then best discards while the loose cards run out (known cards stay)."""
    effort.spend()
    melded = 0
    for meld in best_meld_masks(mask):
        melded |= meld
    loose = discard_order(cards_of(mask & ~melded & ~known))  # best_discard's order on ties
    for card in loose[:extra]:
        mask &= ~(1 << card)
    for _ in range(extra - min(extra, len(loose))):
        effort.spend(mask.bit_count())
        card, _dead = best_discard(mask, known)
        mask &= ~(1 << card)
    return mask
