"""Knock now or wait: both priced by playing the knock out against sampled opponent hands.

Knocking now scores at once against each sampled hand (the opponent lays off, R7.1 to R7.6).
Waiting is played out one round: the opponent, as a greedy player, takes the discard if it
helps or draws, and knocks if it can; otherwise the seat draws and knocks (or goes gin) on
its next turn. Both are priced in the chance of winning the match (``matchplay``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from services.bots.strategies.knowledge import Knowledge
from services.bots.strategies.matchplay import win_chance
from shared.engine.cards import cards_of
from shared.engine.layoffs import best_layoffs
from shared.engine.melds import best_discard, best_meld_masks, deadwood_points

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


def knock_result(stakes: Stakes, kept: int, held: int, defender: int, me_first: bool) -> float:
    """Match chance after the holder of ``kept`` (of ``held``) knocks against ``defender``."""
    knocker_dead = deadwood_points(kept)
    if knocker_dead == 0:
        points = stakes.gin + deadwood_points(defender)
        return stakes.won(points) if me_first else stakes.lost(points)
    melds = best_meld_masks(kept, held=held)
    defender_dead = best_layoffs([cards_of(m) for m in melds], cards_of(defender)).points
    if knocker_dead < defender_dead:
        points = defender_dead - knocker_dead
        return stakes.won(points) if me_first else stakes.lost(points)
    points = knocker_dead - defender_dead + stakes.undercut
    return stakes.lost(points) if me_first else stakes.won(points)


def knock_now(stakes: Stakes, hand: int, card: int, opponents: list[int]) -> float:
    """The mean match chance of knocking now with the discard ``card``."""
    kept = hand & ~(1 << card)
    total = sum(knock_result(stakes, kept, hand, opp, True) for opp in opponents)
    return total / len(opponents)


def wait_once(
    stakes: Stakes, k: Knowledge, hand: int, card: int, opponents: list[int], rng: random.Random
) -> float:
    """The mean match chance of discarding ``card`` now and knocking on the next turn."""
    if k.stock_count <= DEAD_HAND_AT:
        return stakes.stays()  # this discard ends the hand as a dead hand (R8.1)
    kept = hand & ~(1 << card)
    total = 0.0
    for opp in opponents:
        stock = cards_of(k.unseen & ~opp)
        drawn = [int(x) for x in rng.sample(stock, min(2, len(stock)))]
        total += _round(stakes, k, kept, card, opp, drawn)
    return total / len(opponents)


def _round(stakes: Stakes, k: Knowledge, kept: int, card: int, opp: int, drawn: list[int]) -> float:
    """One round after discarding ``card``: the opponent's turn, then the seat's."""
    stock_left = k.stock_count
    bit = 1 << card
    thrown, after = best_discard(opp | bit, bit)
    if after < deadwood_points(opp):
        opp_hand = opp | bit
    else:
        if not drawn:
            return stakes.stays()
        opp_hand = opp | 1 << drawn.pop(0)
        stock_left -= 1
        thrown, after = best_discard(opp_hand)
    if deadwood_points(opp_hand) == 0:
        return stakes.lost(stakes.big_gin + deadwood_points(kept))
    opp_kept = opp_hand & ~(1 << thrown)
    if after <= k.knock_limit:
        return knock_result(stakes, opp_kept, opp_hand, kept, False)
    if stock_left <= DEAD_HAND_AT:
        return stakes.stays()
    return _my_turn(stakes, kept, thrown, opp_kept, drawn)


def _my_turn(stakes: Stakes, kept: int, top: int, opp: int, drawn: list[int]) -> float:
    """The seat draws (the opponent's discard if it helps) and knocks or goes gin."""
    bit = 1 << top
    card, after = best_discard(kept | bit, bit)
    if after < deadwood_points(kept):
        hand = kept | bit
    elif drawn:
        hand = kept | 1 << drawn[0]
        card, after = best_discard(hand)
    else:
        return stakes.stays()
    if deadwood_points(hand) == 0:
        return stakes.won(stakes.big_gin + deadwood_points(opp))
    return knock_result(stakes, hand & ~(1 << card), hand, opp, True)
