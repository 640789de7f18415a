"""Cards, their text form and point values (docs/RULES.md section 1).

A card is an int from 0 to 51: ``suit * 13 + rank`` with rank 0 for the ace up to 12 for the
king and suits in the order c d h s. Sets of cards are 52-bit masks (bit ``card``), so the
meld search works on integers. ``Card`` subclasses ``int`` only to print itself canonically.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.engine.errors import IllegalAction

RANKS = "A23456789TJQK"
SUITS = "cdhs"
SUIT_BITS = 0x1FFF  # the 13 ranks of one suit, in one suit's slice of a mask
FULL_DECK_MASK = (1 << 52) - 1


class Card(int):
    """One card; ``str(card)`` is the canonical two-character form (R1.2).

    >>> Card.of(0, 0), Card.of(9, 2), int(Card.of(12, 3))
    (Ac, Th, 51)
    """

    __slots__ = ()

    @staticmethod
    def of(rank: int, suit: int) -> Card:
        """The card of a rank (0 = ace .. 12 = king) and a suit (0 = c .. 3 = s)."""
        return CARDS[suit * 13 + rank]

    @property
    def rank(self) -> int:
        """0 for the ace up to 12 for the king."""
        return self % 13

    @property
    def suit(self) -> int:
        """0 = clubs, 1 = diamonds, 2 = hearts, 3 = spades."""
        return self // 13

    @property
    def points(self) -> int:
        """The card's deadwood value (R1.3)."""
        return POINTS[self]

    def __str__(self) -> str:
        return RANKS[self % 13] + SUITS[self // 13]

    __repr__ = __str__


CARDS: tuple[Card, ...] = tuple(Card(i) for i in range(52))
POINTS: tuple[int, ...] = tuple(min(i % 13 + 1, 10) for i in range(52))
BY_TEXT: dict[str, Card] = {str(c): c for c in CARDS}


def parse_card(text: str) -> Card:
    """One card from its text: case-insensitive, ``10`` for ``T`` (R1.2).

    >>> parse_card("10H"), parse_card("ad")
    (Th, Ad)
    """
    t = text.strip()
    if len(t) == 3 and t[:2] == "10":
        t = "T" + t[2]
    card = BY_TEXT.get(t[:1].upper() + t[1:].lower()) if len(t) == 2 else None
    if card is None:
        raise IllegalAction(
            "unknown_card",
            f"{text!r} is not a card: write rank then suit, like Ah, 7c, Td or 10d",
            "R1.2",
        )
    return card


def parse_cards(text: str) -> tuple[Card, ...]:
    """Cards from text separated by spaces or commas.

    >>> parse_cards("Ah 7c, Td")
    (Ah, 7c, Td)
    """
    return tuple(parse_card(word) for word in text.replace(",", " ").split())


def mask_of(cards: Iterable[int]) -> int:
    """The bit mask of some cards."""
    mask = 0
    for card in cards:
        mask |= 1 << card
    return mask


def cards_of(mask: int) -> tuple[Card, ...]:
    """The cards of a mask, in canonical order (suit, then rank)."""
    return (
        SUIT_CARDS[0][mask & SUIT_BITS]
        + SUIT_CARDS[1][(mask >> 13) & SUIT_BITS]
        + SUIT_CARDS[2][(mask >> 26) & SUIT_BITS]
        + SUIT_CARDS[3][(mask >> 39) & SUIT_BITS]
    )


def points_of(mask: int) -> int:
    """The deadwood value of the cards of a mask."""
    total = 0
    for suit in range(4):
        total += SUIT_POINTS[(mask >> (13 * suit)) & SUIT_BITS]
    return total


def _suit_points(bits: int) -> int:
    return sum(min(rank + 1, 10) for rank in range(13) if bits >> rank & 1)


# Deadwood value of every 13-bit slice of one suit: four lookups price any hand.
SUIT_POINTS: tuple[int, ...] = tuple(_suit_points(b) for b in range(1 << 13))

TEXTS: tuple[str, ...] = tuple(str(c) for c in CARDS)
# The cards of every 13-bit slice of each suit: four lookups list any hand.
SUIT_CARDS: tuple[tuple[tuple[Card, ...], ...], ...] = tuple(
    tuple(
        tuple(CARDS[suit * 13 + r] for r in range(13) if bits >> r & 1) for bits in range(1 << 13)
    )
    for suit in range(4)
)
