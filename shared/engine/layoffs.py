"""Layoffs: the defender's best answer to a knock (docs/RULES.md R7.1 to R7.3).

Each of the knocker's melds offers a few ways to be extended by the defender's cards: the
fourth card of a set; a chain down from a run's lowest card and a chain up from its highest.
The search tries every combination of those extensions that uses each card once and prices
what is left with the meld search, so the defender's own melds and the layoffs are chosen
together (R7.2): a card may be worth more laid off than kept in a meld of the defender's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import product

import msgspec

from shared.engine.cards import CARDS, Card, mask_of
from shared.engine.melds import Arrangement, arrangement_of, best_meld_masks, deadwood_points

# One way to extend one meld: the cards laid off on it, in an order in which they can be laid.
Extension = tuple[Card, ...]


class Layoffs(msgspec.Struct, frozen=True):
    """The defender's result: cards laid off (card, index of the knocker's meld), own melds."""

    laid_off: tuple[tuple[Card, int], ...]
    melds: tuple[tuple[Card, ...], ...]
    deadwood: tuple[Card, ...]
    points: int


def _chain(start: int, step: int, stop: int, held: int) -> list[Card]:
    """Cards the defender holds going from ``start`` by ``step`` while the chain lasts."""
    out = []
    card = start
    while card != stop and held >> card & 1:
        out.append(CARDS[card])
        card += step
    return out


def extensions(meld: Sequence[int], held: int) -> list[Extension]:
    """Every way the holder of ``held`` can extend one meld, the empty way first (R7.1)."""
    cards = sorted(meld)
    first, last = cards[0], cards[-1]
    if first // 13 == last // 13:  # a run: chains below and above, the ace never above a king
        suit_base = first - first % 13
        below = _chain(first - 1, -1, suit_base - 1, held)
        above = _chain(last + 1, 1, suit_base + 13, held)
        return [
            tuple(below[:i]) + tuple(above[:j])
            for i in range(len(below) + 1)
            for j in range(len(above) + 1)
        ]
    if len(cards) == 3:
        rank = first % 13
        fourth = next(s * 13 + rank for s in range(4) if s * 13 + rank not in cards)
        if held >> fourth & 1:
            return [(), (CARDS[fourth],)]
    return [()]


def best_layoffs(knocker_melds: Iterable[Sequence[int]], defender_cards: Iterable[int]) -> Layoffs:
    """The defender's lowest deadwood after layoffs, with layoffs and own melds (R7.2).

    Ties: the fewest layoffs, then the canonical order of the laid-off cards.

    >>> from shared.engine.cards import parse_cards as p
    >>> best_layoffs([p("4h 5h 6h")], p("7h 8h Kc")).laid_off
    ((7h, 0), (8h, 0))
    """
    melds = [tuple(m) for m in knocker_melds]
    defender = mask_of(defender_cards)
    options = [extensions(meld, defender) for meld in melds]
    best_key: tuple[int, int, tuple[int, ...]] | None = None
    best_choice: tuple[Extension, ...] = tuple(() for _ in melds)
    for choice in product(*options):
        used = 0
        count = 0
        for ext in choice:
            for card in ext:
                used |= 1 << card
            count += len(ext)
        if used.bit_count() != count:
            continue  # the same card offered to two melds
        key = (
            deadwood_points(defender & ~used),
            count,
            tuple(sorted(c for e in choice for c in e)),
        )
        if best_key is None or key < best_key:
            best_key, best_choice = key, choice
    laid = tuple((card, i) for i, ext in enumerate(best_choice) for card in ext)
    rest = defender & ~mask_of(card for card, _ in laid)
    own: Arrangement = arrangement_of(rest, best_meld_masks(rest))
    return Layoffs(laid_off=laid, melds=own.melds, deadwood=own.deadwood, points=own.points)
