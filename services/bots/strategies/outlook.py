"""A hand's outlook: its deadwood now and what the next draw from the stock may do for it.

``Outlook`` prices ten-card hands for one decision, caching the meld searches it repeats. The
value of a hand is its deadwood less ``potential`` times the deadwood the next stock card is
expected to save (each unseen card weighted by the chance it is in the stock, not in the
opponent's hand). ``feed`` prices a discard by what it would save the opponent's sampled hands.
"""

from __future__ import annotations

from shared.engine.cards import POINTS, Card, cards_of
from shared.engine.melds import best_meld_masks, deadwood_points


def _reach(card: int) -> int:
    """The mask of cards that can share a meld with ``card`` alongside one more card."""
    rank, suit = card % 13, card // 13
    mask = 0
    for s in range(4):
        mask |= 1 << (s * 13 + rank)
    for d in (-2, -1, 1, 2):
        if 0 <= rank + d < 13:
            mask |= 1 << (suit * 13 + rank + d)
    return mask & ~(1 << card)


REACH = tuple(_reach(card) for card in range(52))


LAYOFF_SEARCH = 6  # meld searches a defender's best layoffs cost, about


class Effort:
    """The meld searches one decision may still make: its time budget counted in work, so the
    same view and seed make the same decision however busy the machine is. Every search the
    decision makes is counted; the parts that grow with the samples stop once it is spent."""

    __slots__ = ("budget", "spent")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.spent = 0

    @classmethod
    def unlimited(cls) -> Effort:
        """An effort no decision spends (for callers without a budget)."""
        return cls(1 << 62)

    def spend(self, searches: int = 1) -> None:
        """Count ``searches`` meld searches."""
        self.spent += searches

    @property
    def exhausted(self) -> bool:
        """Whether the budget is spent."""
        return self.spent >= self.budget


class Outlook:
    """Hand values for one decision: stock chances and caches of the meld searches."""

    def __init__(
        self, stock_chances: list[float], potential: float, effort: Effort | None = None
    ) -> None:
        self.draws = [(card, p) for card, p in enumerate(stock_chances) if p > 0]
        self.potential = potential
        self.effort = Effort.unlimited() if effort is None else effort
        self._dead: dict[int, int] = {}
        self._drop: dict[int, int] = {}
        self._gain: dict[int, float] = {}
        self._order: dict[int, list[int]] = {}
        self._melds: dict[tuple[int, int], list[tuple[Card, ...]]] = {}

    def dead(self, mask: int) -> int:
        """The deadwood of a hand (cached)."""
        value = self._dead.get(mask)
        if value is None:
            self.effort.spent += 1
            value = self._dead[mask] = deadwood_points(mask)
        return value

    def melds(self, kept: int, held: int) -> list[tuple[Card, ...]]:
        """The melds a knock with ``kept`` (of ``held``) lays down, as the server picks them."""
        key = (kept, held)
        value = self._melds.get(key)
        if value is None:
            self.effort.spent += 1
            value = self._melds[key] = [cards_of(m) for m in best_meld_masks(kept, held=held)]
        return value

    def order(self, mask: int) -> list[int]:
        """The cards of a hand, highest value first (cached)."""
        value = self._order.get(mask)
        if value is None:
            value = self._order[mask] = sorted(cards_of(mask), key=POINTS.__getitem__, reverse=True)
        return value

    def best_without_one(self, mask: int) -> int:
        """The lowest deadwood of the hand less one card (cached)."""
        value = self._drop.get(mask)
        if value is None:
            value = self._drop[mask] = self._lowest(mask, 1000, self.order(mask))
        return value

    def _lowest(self, whole_mask: int, best: int, order: list[int]) -> int:
        """The lowest deadwood of ``whole_mask`` less one of ``order``, or ``best``."""
        whole = self.dead(whole_mask)
        for card in order:
            if whole - POINTS[card] >= best:
                break  # removing a card saves at most its value, and values only fall
            self.effort.spent += 1
            dead = deadwood_points(whole_mask & ~(1 << card))
            if dead < best:
                best = dead
        return best

    def keep(self, mask: int, forbidden: int = 0) -> int:
        """The best ten of eleven cards: the lowest deadwood, the highest card thrown on ties."""
        whole = self.dead(mask)
        best, thrown = 1000, -1
        for card in self.order(mask):
            if whole - POINTS[card] >= best:
                break
            if forbidden >> card & 1:
                continue
            dead = self.dead(mask & ~(1 << card))
            if dead < best:
                best, thrown = dead, card
        return mask & ~(1 << thrown)

    def kept(self, mask: int, card: int) -> int:
        """The deadwood of the best ten of a ten-card hand plus ``card`` (which may go again)."""
        dead = self.dead(mask)
        if not mask & REACH[card]:  # the card melds with nothing held: a plain swap at best
            return min(dead, POINTS[card] + self.best_without_one(mask))
        return self._lowest(mask | 1 << card, dead, self.order(mask))

    def taken(self, mask: int, card: int) -> int:
        """The deadwood of the best ten of a hand plus ``card`` taken from the pile (kept)."""
        if not mask & REACH[card]:
            return POINTS[card] + self.best_without_one(mask)
        return self._lowest(mask | 1 << card, 1000, self.order(mask))

    def gain(self, mask: int) -> float:
        """The deadwood the next stock card is expected to save this ten-card hand."""
        value = self._gain.get(mask)
        if value is None:
            dead = self.dead(mask)
            value = 0.0
            for card, p in self.draws:
                value += p * (dead - self.kept(mask, card))
            self._gain[mask] = value
        return value

    def value(self, mask: int) -> float:
        """The hand's deadwood less its weighted potential (lower is better)."""
        return self.dead(mask) - self.potential * self.gain(mask)

    def feed(self, card: int, opponent_hands: list[int]) -> float:
        """The deadwood ``card`` would save the opponent on average, over sampled hands."""
        if not opponent_hands:
            return 0.0
        total = 0
        for hand in opponent_hands:
            total += max(0, self.dead(hand) - self.taken(hand, card))
        return total / len(opponent_hands)


def knock_threat(outlook: Outlook, opponent_hands: list[int], limit: int) -> float:
    """About how likely the opponent is to be able to knock after its next draw.

    For each sampled hand: the chance that the next stock card, swapped for its worst card,
    leaves deadwood within the limit (melds the card would make are left out).
    """
    if not opponent_hands:
        return 0.0
    within = [0.0] * 12  # within[v]: the chance the next card is worth at most v points
    for card, p in outlook.draws:
        within[POINTS[card]] += p
    for value in range(1, 12):
        within[value] += within[value - 1]
    total = 0.0
    for hand in opponent_hands:
        room = limit - outlook.best_without_one(hand)
        total += within[min(room, 11)] if room > 0 else 0.0
    return total / len(opponent_hands)


def stock_chances(unseen: int, held: list[float]) -> list[float]:
    """The chance (52) that each card is the next one drawn from the stock."""
    chances = [0.0] * 52
    for card in cards_of(unseen):
        chances[card] = max(0.0, 1.0 - held[card])
    total = sum(chances)
    if total > 0:
        chances = [p / total for p in chances]
    return chances
