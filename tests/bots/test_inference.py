"""LUNA's opponent model (issue 18): what declined, thrown and taken cards say about a hand."""

from __future__ import annotations

import random

import pytest

from services.bots.strategies.inference import (
    MIN_SAMPLES,
    discard_regret,
    hint_likelihood,
    melds_with,
    opponent_weights,
    sample_hands,
)
from services.bots.strategies.knowledge import Knowledge
from services.bots.strategies.outlook import Effort
from shared.engine.cards import FULL_DECK_MASK, mask_of, parse_card, parse_cards
from shared.engine.melds import deadwood_points


def mask(text: str) -> int:
    return mask_of(parse_cards(text))


def card(text: str) -> int:
    return int(parse_card(text))


@pytest.mark.parametrize(
    ("top", "hand", "melds"),
    [
        ("7h", "5h 6h Kc", True),  # the top end of a run
        ("7h", "6h 8h", True),  # the middle
        ("7h", "8h 9h", True),  # the bottom end
        ("7h", "7c 7s", True),  # a set
        ("7h", "7c 6h 8c", False),  # one mate, one neighbour: no meld
        ("Ah", "Qh Kh", False),  # runs do not wrap (R1.4)
        ("Kh", "Qh Jh", True),
    ],
)
def test_melds_with(top: str, hand: str, melds: bool) -> None:
    assert melds_with(card(top), mask(hand)) is melds


def test_discard_regret_is_zero_for_a_best_discard_and_counts_a_broken_meld() -> None:
    kept = mask("2c 3c 4c 5d 5h 5s 9h Td Jc Qs")
    assert discard_regret(kept, card("Kh")) == 0  # the king was the worst card
    assert discard_regret(kept, card("Ac")) == 10  # the ace ran on 2c3c4c: a ten could go
    assert discard_regret(kept, card("5c")) == 10  # the fourth five: the same


def knowledge(passed: str = "", discards: str = "", known: str = "") -> Knowledge:
    mine = mask("Ac 2d 3h 4s 9c Td Jh Qs Kc 8d")
    pile = parse_cards(discards)
    seen = mine | mask(discards) | mask(known)
    return Knowledge(
        seat=0,
        phase="discard",
        hand=mine,
        pile=tuple(int(x) for x in pile),
        discarded_by=(1,) * len(pile),
        opp_known=mask(known),
        opp_passed=mask(passed),
        opp_discards=mask(discards),
        unseen=FULL_DECK_MASK & ~seen,
        opp_hidden=10 - mask(known).bit_count(),
        stock_count=20,
        knock_limit=10,
        scores=(0, 0),
        target=100,
    )


def test_a_hand_that_melds_with_a_declined_card_is_less_likely() -> None:
    k = knowledge(passed="7h")
    assert hint_likelihood(k, mask("6h 8h 2c 3c")) < hint_likelihood(k, mask("6h 9h 2c 3c"))


def test_a_taken_card_is_expected_to_meld() -> None:
    k = knowledge(known="7h")
    assert hint_likelihood(k, mask("7h 6h 8h Kd")) > hint_likelihood(k, mask("7h 6c 9h Kd"))


def test_sampled_hands_rarely_meld_with_the_cards_it_declined_and_threw() -> None:
    hints = "5c 6d 7s 9h"
    k = knowledge(passed=hints, discards="Ks Qd")
    hands = sample_hands(k, opponent_weights(k), random.Random(1), 300)
    melding = sum(any(melds_with(card(t), hand) for t in hints.split()) for hand in hands)
    plain = sample_hands(knowledge(), opponent_weights(knowledge()), random.Random(1), 300)
    plain_melding = sum(any(melds_with(card(t), hand) for t in hints.split()) for hand in plain)
    assert melding < plain_melding / 2
    assert all(hand & k.unseen == hand for hand in hands)
    assert all(hand.bit_count() == 10 for hand in hands)


def test_a_patient_opponent_may_hold_a_hand_it_could_knock_with() -> None:
    """Issue 35: with ``eager`` 1 hands within the knock limit are redrawn (it would have
    knocked); with ``eager`` 0 (a gin hunter seen passing up knocks) they are kept."""
    k = knowledge(known="7h 7c 7d")  # three sevens already in its hand: low hands are common
    weights = opponent_weights(k)
    eager = sample_hands(k, weights, random.Random(2), 300, eager=1.0)
    patient = sample_hands(k, weights, random.Random(2), 300, eager=0.0)
    within = [sum(deadwood_points(h) <= k.knock_limit for h in hands) for hands in (eager, patient)]
    assert within[0] * 2 < within[1]


def test_sampling_stops_at_a_spent_budget() -> None:
    k = knowledge(passed="5c", discards="Ks")
    spent = Effort(0)
    hands = sample_hands(k, opponent_weights(k), random.Random(3), 96, effort=spent)
    assert len(hands) == MIN_SAMPLES
    free = Effort(1 << 40)
    assert len(sample_hands(k, opponent_weights(k), random.Random(3), 96, effort=free)) == 96
    assert free.spent > spent.spent > 0
