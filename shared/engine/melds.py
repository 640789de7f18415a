"""Melds, deadwood and the best arrangement of a hand (docs/RULES.md section 2, R2.5, R6.4, R6.5).

The search works on 52-bit masks. Once the sets are chosen, the best runs of what is left are
forced: in each suit every card of a stretch of three or more consecutive ranks is melded
(one run per stretch), and nothing else can be. So the search only enumerates the choice of
sets (at most three ranks of 3 or 4 cards in 11 cards), and prices each choice with four
table lookups. Ties in deadwood go to the arrangement that offers the fewest layoff spots
(R6.4), then to the canonical order (R2.4), so the SOBRA counter and a knock always agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import product

import msgspec

from shared.engine.cards import (
    CARDS,
    POINTS,
    SUIT_BITS,
    SUIT_POINTS,
    Card,
    cards_of,
    mask_of,
    points_of,
)
from shared.engine.errors import IllegalAction


class Arrangement(msgspec.Struct, frozen=True):
    """A hand laid out: its melds (each in canonical order), its deadwood and their points."""

    melds: tuple[tuple[Card, ...], ...]
    deadwood: tuple[Card, ...]
    points: int


def _stretches(bits: int) -> tuple[int, ...]:
    """The maximal runs of 3 or more consecutive ranks in one suit's 13 bits."""
    out = []
    rank = 0
    while rank < 13:
        if bits >> rank & 1:
            start = rank
            while rank < 13 and bits >> rank & 1:
                rank += 1
            if rank - start >= 3:
                out.append(((1 << (rank - start)) - 1) << start)
        else:
            rank += 1
    return tuple(out)


RUN_STRETCHES: tuple[tuple[int, ...], ...] = tuple(_stretches(b) for b in range(1 << 13))
RUN_MELDED: tuple[int, ...] = tuple(sum(s) for s in RUN_STRETCHES)
# Deadwood points of one suit's cards once its runs are melded.
RUN_DEADWOOD: tuple[int, ...] = tuple(SUIT_POINTS[b & ~RUN_MELDED[b]] for b in range(1 << 13))


def _set_options(rank: int, suits: int) -> tuple[int, ...]:
    """Every way to meld a rank held in ``suits`` (4 bits): no set, each set of 3, the 4."""
    held = [s for s in range(4) if suits >> s & 1]
    options = [0]
    if len(held) >= 3:
        for left_out in held if len(held) == 4 else [None]:
            options.append(mask_of(s * 13 + rank for s in held if s != left_out))
    if len(held) == 4:
        options.append(mask_of(s * 13 + rank for s in held))
    return tuple(options)


SET_OPTIONS: tuple[tuple[int, ...], ...] = tuple(
    _set_options(rank, suits) for rank in range(13) for suits in range(16)
)


def _ranks_of_three(mask: int) -> int:
    """13 bits: the ranks held in three or four suits."""
    c = mask & SUIT_BITS
    d = (mask >> 13) & SUIT_BITS
    h = (mask >> 26) & SUIT_BITS
    s = mask >> 39
    return (c & d & (h | s)) | (h & s & (c | d))


def _suits_of_rank(mask: int, rank: int) -> int:
    return (
        (mask >> rank & 1)
        | (mask >> (rank + 12) & 2)
        | (mask >> (rank + 24) & 4)
        | (mask >> (rank + 36) & 8)
    )


def _runs_deadwood(rest: int) -> int:
    return (
        RUN_DEADWOOD[rest & SUIT_BITS]
        + RUN_DEADWOOD[(rest >> 13) & SUIT_BITS]
        + RUN_DEADWOOD[(rest >> 26) & SUIT_BITS]
        + RUN_DEADWOOD[rest >> 39]
    )


def _set_choices(tri: int, mask: int) -> list[tuple[int, ...]]:
    per_rank = []
    while tri:
        low = tri & -tri
        rank = low.bit_length() - 1
        per_rank.append(SET_OPTIONS[rank * 16 + _suits_of_rank(mask, rank)])
        tri ^= low
    return list(product(*per_rank))


def deadwood_points(mask: int) -> int:
    """The lowest deadwood count of the cards of a mask (R2.3, R2.4)."""
    tri = _ranks_of_three(mask)
    if not tri:
        return _runs_deadwood(mask)
    best = 1000
    for choice in _set_choices(tri, mask):
        sets = 0
        for s in choice:
            sets |= s
        dead = _runs_deadwood(mask & ~sets)
        if dead < best:
            best = dead
    return best


def _melds_of(mask: int, sets: Sequence[int]) -> list[int]:
    """The meld masks of an arrangement: the chosen sets, then the forced runs."""
    melds = [s for s in sets if s]
    rest = mask
    for s in melds:
        rest &= ~s
    for suit in range(4):
        shift = 13 * suit
        for stretch in RUN_STRETCHES[(rest >> shift) & SUIT_BITS]:
            melds.append(stretch << shift)
    return melds


def layoff_spots(melds: Iterable[int], held: int) -> int:
    """How many cards not in ``held`` could be laid off at once on these melds (R6.4)."""
    spots = 0
    for meld in melds:
        cards = cards_of(meld)
        first, last = cards[0], cards[-1]
        if first.suit == last.suit:  # a run
            if first.rank > 0 and not held >> (first - 1) & 1:
                spots += 1
            if last.rank < 12 and not held >> (last + 1) & 1:
                spots += 1
        elif len(cards) == 3:  # a set of three: the fourth suit
            rank = first.rank
            missing = next(s for s in range(4) if not meld >> (s * 13 + rank) & 1)
            if not held >> (missing * 13 + rank) & 1:
                spots += 1
    return spots


def _canonical(melds: list[int]) -> tuple[tuple[Card, ...], ...]:
    return tuple(sorted(cards_of(m) for m in melds))


def best_meld_masks(mask: int, held: int | None = None) -> list[int]:
    """The melds of the best arrangement of a mask, ties broken as R6.4 and R2.4 say.

    ``held`` is every card the owner holds (for counting layoff spots); the mask by default.
    """
    tri = _ranks_of_three(mask)
    if not tri:
        return _melds_of(mask, ())
    held = mask if held is None else held
    best_dead = 1000
    tied: list[tuple[int, ...]] = []
    for choice in _set_choices(tri, mask):
        sets = 0
        for s in choice:
            sets |= s
        dead = _runs_deadwood(mask & ~sets)
        if dead < best_dead:
            best_dead, tied = dead, [choice]
        elif dead == best_dead:
            tied.append(choice)
    if len(tied) == 1:
        return _melds_of(mask, tied[0])
    candidates = [_melds_of(mask, choice) for choice in tied]
    return min(candidates, key=lambda m: (layoff_spots(m, held), _canonical(m)))


def arrangement_of(mask: int, melds: Sequence[int]) -> Arrangement:
    """The Arrangement of a mask with these meld masks."""
    rest = mask
    for meld in melds:
        rest &= ~meld
    ordered = sorted(cards_of(m) for m in melds)
    return Arrangement(melds=tuple(ordered), deadwood=cards_of(rest), points=points_of(rest))


def best_arrangement(cards: Iterable[int]) -> Arrangement:
    """The arrangement of 0 to 11 cards with the lowest deadwood (R2.4).

    >>> from shared.engine.cards import parse_cards
    >>> best_arrangement(parse_cards("4c 5c 6c 9h 9d 9s Kh 2s"))
    Arrangement(melds=((4c, 5c, 6c), (9d, 9h, 9s)), deadwood=(Kh, 2s), points=12)
    """
    mask = mask_of(cards)
    return arrangement_of(mask, best_meld_masks(mask))


def discard_order(cards: Iterable[int]) -> list[Card]:
    """Cards in the order R6.5 prefers to discard them on ties: highest value, rank, suit."""
    return sorted(
        (CARDS[c] for c in cards), key=lambda c: (POINTS[c], c % 13, c // 13), reverse=True
    )


def best_discard(mask: int, forbidden: int = 0) -> tuple[Card, int]:
    """The discard of 11 cards that leaves the lowest deadwood, and that deadwood (R6.5).

    ``forbidden`` is a mask of cards that may not be discarded (the card just taken from the
    discard pile, R5.3). Discarding a card lowers the deadwood by at most its value, which
    prunes most of the search.
    """
    whole = deadwood_points(mask)
    best_card: Card | None = None
    best = 1000
    for card in discard_order(cards_of(mask & ~forbidden)):
        if best_card is not None and whole - POINTS[card] >= best:
            break  # values only fall from here, so no later card can do strictly better
        dead = deadwood_points(mask & ~(1 << card))
        if dead < best:
            best_card, best = card, dead
    if best_card is None:
        raise IllegalAction("no_discard", "there is no card that may be discarded", "R5.3")
    return best_card, best


def knock_options(mask: int, forbidden: int, limit: int) -> list[tuple[Card, int]]:
    """Each discard of 11 cards that leaves deadwood within the limit, with that deadwood."""
    whole = deadwood_points(mask)
    out = []
    for card in cards_of(mask & ~forbidden):
        if whole - POINTS[card] > limit:
            continue
        dead = deadwood_points(mask & ~(1 << card))
        if dead <= limit:
            out.append((card, dead))
    return out


def kept_arrangement(mask: int, discard: int) -> Arrangement:
    """The arrangement of the 10 cards kept after discarding one of 11 (R2.5, R6.4)."""
    kept = mask & ~(1 << discard)
    return arrangement_of(kept, best_meld_masks(kept, held=mask))


def is_meld(cards: Sequence[int]) -> bool:
    """A set of 3 or 4 of one rank, or a run of 3 or more of one suit (R2.1, R2.2, R1.4)."""
    if len(cards) < 3 or len(set(cards)) != len(cards):
        return False
    ranks = sorted(c % 13 for c in cards)
    if len({c // 13 for c in cards}) == 1:
        return ranks == list(range(ranks[0], ranks[0] + len(ranks)))
    return len(cards) <= 4 and len(set(ranks)) == 1
