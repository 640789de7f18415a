"""The opponent-model scorer of ``bench/luna_posterior.py``: what it records and how it scores."""

from __future__ import annotations

import math

import pytest

from bench.luna_posterior import CLIP, Decision, load_model, record, score, strategy_spec
from services.bots.strategies import luna
from services.bots.strategies.knowledge import mask_of_texts


@pytest.fixture(scope="module")
def decisions() -> list[Decision]:
    return record("simple", 1, 5)


def test_it_records_lunas_discard_decisions_with_the_real_opposing_hand(
    decisions: list[Decision],
) -> None:
    assert decisions
    for d in decisions:
        hand = d.view.hand
        assert hand is not None
        assert hand.my_cards is not None
        assert hand.phase == "discard"
        mine = mask_of_texts(hand.my_cards)
        assert d.opponent & mine == 0
        assert d.opponent.bit_count() == hand.card_counts[1 - (d.view.you or 0)]
    assert luna.end_turn.__name__ == "end_turn"  # the recorder put LUNA back as she was
    assert luna.end_turn.__module__ == luna.__name__


def test_a_model_that_knows_the_hand_scores_the_floor_and_lunas_sits_between(
    decisions: list[Decision],
) -> None:
    by_hand = {
        mask_of_texts(d.view.hand.my_cards or ()): d.opponent for d in decisions if d.view.hand
    }

    def knows(mind: luna.Mind, count: int) -> list[int]:
        """The real hand, found by LUNA's own cards (no two of her decisions hold the same)."""
        return [by_hand[mind.k.hand]] * count

    perfect = score(decisions, knows, 32)["log_loss"]
    lunas = score(decisions, load_model(None), 32)["log_loss"]
    assert isinstance(perfect, dict)
    assert isinstance(lunas, dict)
    assert perfect["model"] == pytest.approx(-math.log(1 - CLIP), abs=1e-4)
    assert perfect["model"] < lunas["share 0.25"] < lunas["share 0.08"] < lunas["model"]
    assert lunas["model"] < lunas["base rate"]


def test_an_opponent_is_named_by_level_module_or_callable() -> None:
    assert strategy_spec("luna") == "luna"
    assert strategy_spec("hunter") == "services.bots.strategies.hunter:decide"
    assert strategy_spec("pkg.mod:fn") == "pkg.mod:fn"
