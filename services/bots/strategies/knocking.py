"""Knock now or wait: both priced by playing the knock out against sampled opponent hands.

Knocking now scores at once against each sampled hand (the opponent lays off, R7.1 to R7.6).
Waiting is played out for a few rounds: the opponent, as a greedy player, takes the discard
if it helps or draws, and knocks as soon as it can (which may let the seat undercut it) when
the seat believes it is such a player (``eager``; a sampled hand it could already knock with
marks a patient one, which only goes gin); the seat draws the same way, goes gin at once, and
knocks after 1, 2 .. rounds. Each is priced in
the chance of winning the match (``matchplay``); the best wait is compared with knocking now.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from services.bots.strategies.knowledge import Knowledge
from services.bots.strategies.matchplay import win_chance
from services.bots.strategies.outlook import LAYOFF_SEARCH, Outlook
from shared.engine.cards import cards_of
from shared.engine.layoffs import best_layoffs

MIN_ROLLOUTS = 16  # rollouts a wait is priced on, whatever the budget
DEAD_HAND_AT = 2  # R8.1: a discard with 2 or fewer cards in the stock ends the hand


@dataclass(frozen=True, slots=True)
class Stakes:
    """The bonuses and scores a hand's result is priced with."""

    mine: int
    theirs: int
    target: int
    gin: int
    big_gin: int
    undercut: int

    def won(self, points: int) -> float:
        """The chance of winning the match after the seat scores ``points``."""
        return win_chance(self.mine + points, self.theirs, self.target)

    def lost(self, points: int) -> float:
        """The chance of winning the match after the opponent scores ``points``."""
        return win_chance(self.mine, self.theirs + points, self.target)

    def stays(self) -> float:
        """The chance of winning the match when nobody scores (a dead hand)."""
        return win_chance(self.mine, self.theirs, self.target)


def knock_result(
    stakes: Stakes, prices: Outlook, kept: int, held: int, defender: int, me_first: bool
) -> float:
    """Match chance after the holder of ``kept`` (of ``held``) knocks against ``defender``."""
    knocker_dead = prices.dead(kept)
    if knocker_dead == 0:
        points = stakes.gin + prices.dead(defender)
        return stakes.won(points) if me_first else stakes.lost(points)
    prices.effort.spend(LAYOFF_SEARCH)
    defender_dead = best_layoffs(prices.melds(kept, held), cards_of(defender)).points
    if knocker_dead < defender_dead:
        points = defender_dead - knocker_dead
        return stakes.won(points) if me_first else stakes.lost(points)
    points = knocker_dead - defender_dead + stakes.undercut
    return stakes.lost(points) if me_first else stakes.won(points)


def knock_now(stakes: Stakes, prices: Outlook, hand: int, card: int, opponents: list[int]) -> float:
    """The mean match chance of knocking now with the discard ``card``."""
    kept = hand & ~(1 << card)
    total = sum(knock_result(stakes, prices, kept, hand, opp, True) for opp in opponents)
    return total / len(opponents)


def waiting(
    stakes: Stakes,
    prices: Outlook,
    k: Knowledge,
    card: int,
    opponents: list[int],
    rng: random.Random,
    rounds: int,
    eager: float = 1.0,
) -> list[float]:
    """The mean match chance of discarding ``card`` now and knocking after 1, 2 .. ``rounds``
    more turns (gin at once), over the sampled opponent hands."""
    if k.stock_count <= DEAD_HAND_AT:
        return [stakes.stays()] * rounds  # this discard ends the hand as a dead hand (R8.1)
    kept = k.hand & ~(1 << card)
    totals = [0.0] * rounds
    played = 0
    for opp in opponents:
        if played >= MIN_ROLLOUTS and prices.effort.exhausted:
            break  # the decision's budget is spent: price the wait on the rollouts played
        played += 1
        stock = cards_of(k.unseen & ~opp)
        drawn = [int(x) for x in rng.sample(stock, min(2 * rounds, len(stock)))]
        knocks = prices.dead(opp) > k.knock_limit and (eager >= 1.0 or rng.random() < eager)
        limit = k.knock_limit if knocks else 0
        rollout = Rollout(stakes, prices, limit, k.stock_count, drawn)
        for i, value in enumerate(rollout.play(kept, card, opp, rounds)):
            totals[i] += value
    return [total / max(1, played) for total in totals]


class Rollout:
    """A few rounds played out against one sampled opponent hand and stock."""

    def __init__(
        self, stakes: Stakes, prices: Outlook, limit: int, stock_left: int, drawn: list[int]
    ) -> None:
        self.stakes = stakes
        self.prices = prices
        self.limit = limit
        self.stock_left = stock_left
        self.drawn = drawn

    def _draw(self) -> int | None:
        if not self.drawn or self.stock_left <= 0:
            return None
        self.stock_left -= 1
        return self.drawn.pop(0)

    def _draws(self, hand: int, top: int) -> int:
        """A greedy draw: the top if it lowers the deadwood kept, else the stock (-1: none)."""
        if self.prices.taken(hand, top) < self.prices.dead(hand):
            return top
        card = self._draw()
        return -1 if card is None else card

    def play(self, kept: int, top: int, opp: int, rounds: int) -> list[float]:
        """The match chance of knocking after each of ``rounds`` turns of the seat."""
        out: list[float] = []
        while len(out) < rounds:
            over, value, opp, top = self._their_turn(kept, top, opp)
            if over:
                return out + [value] * (rounds - len(out))
            over, value, kept, top, knock = self._my_turn(kept, top, opp)
            if over:
                return out + [value] * (rounds - len(out))
            out.append(knock)
            if self.stock_left <= DEAD_HAND_AT:  # waiting on: this discard ends the hand
                return out + [self.stakes.stays()] * (rounds - len(out))
        return out

    def _their_turn(self, mine: int, top: int, opp: int) -> tuple[bool, float, int, int]:
        """The opponent, a greedy player, takes the top if it helps, else draws; knocks if it
        can. (over, match chance if over, its ten cards, its discard)."""
        prices, stakes = self.prices, self.stakes
        card = self._draws(opp, top)
        if card < 0:
            return True, stakes.stays(), opp, top
        hand = opp | 1 << card
        if prices.dead(hand) == 0:
            return True, stakes.lost(stakes.big_gin + prices.dead(mine)), opp, top
        kept = prices.keep(hand, 1 << card if card == top else 0)
        thrown = (hand & ~kept).bit_length() - 1
        if prices.dead(kept) <= self.limit:
            return True, knock_result(stakes, prices, kept, hand, mine, False), kept, thrown
        if self.stock_left <= DEAD_HAND_AT:
            return True, stakes.stays(), kept, thrown
        return False, 0.0, kept, thrown

    def _my_turn(self, kept: int, top: int, opp: int) -> tuple[bool, float, int, int, float]:
        """The seat takes the top if it helps, else draws; gin ends the hand. (over, match
        chance if over, the ten kept, the discard, the match chance of knocking now)."""
        prices, stakes = self.prices, self.stakes
        card = self._draws(kept, top)
        if card < 0:
            return True, stakes.stays(), kept, top, 0.0
        hand = kept | 1 << card
        if prices.dead(hand) == 0:
            return True, stakes.won(stakes.big_gin + prices.dead(opp)), kept, top, 0.0
        kept = prices.keep(hand, 1 << card if card == top else 0)
        thrown = (hand & ~kept).bit_length() - 1
        knock = knock_result(stakes, prices, kept, hand, opp, True)
        if prices.dead(kept) == 0:
            return True, knock, kept, thrown, knock
        return False, 0.0, kept, thrown, knock
