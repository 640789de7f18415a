"""Layoffs: docs/RULES.md R7.1 to R7.4, and the layoff vectors of section 12."""

from __future__ import annotations

import pytest

from shared.contracts import commands as c
from shared.engine import best_layoffs, parse_cards
from shared.engine.cards import mask_of
from shared.engine.layoffs import extensions
from tests.engine.helpers import after_first_draw, knock, play, play_all, rigged_deck, start


def p(text: str) -> tuple[int, ...]:
    return tuple(int(card) for card in parse_cards(text))


def laid(result) -> list[tuple[str, int]]:
    return [(str(card), meld) for card, meld in result.laid_off]


def strs(cards) -> list[str]:
    return [str(x) for x in cards]


def knock_as_non_dealer(knocker: str, defender: str, junk: str = "Qd", **kwargs):
    """Seat 0 (non-dealer) draws ``junk`` on its first turn and knocks: the hand record."""
    state = after_first_draw(knocker, defender, junk)
    _, events = play(state, knock(card=kwargs.get("card", junk), melds=kwargs.get("melds")))
    return events[0]


# --- R7.1: what may be laid off --------------------------------------------------------


def test_r7_1_fourth_card_of_a_set():
    result = best_layoffs([p("4c 4h 4s")], p("4d Kc"))
    assert laid(result) == [("4d", 0)]
    assert result.points == 10


def test_r7_1_a_set_of_four_takes_nothing():
    assert extensions(p("4c 4d 4h 4s"), mask_of(p("4c 4d 4h 4s 3c 5c"))) == [()]


def test_r7_1_card_below_the_lowest_and_above_the_highest_of_a_run():
    result = best_layoffs([p("5s 6s 7s")], p("4s 8s Kc"))
    assert sorted(laid(result)) == [("4s", 0), ("8s", 0)]
    assert strs(result.deadwood) == ["Kc"]
    assert result.points == 10


def test_r7_1_only_the_same_suit_extends_a_run():
    result = best_layoffs([p("5s 6s 7s")], p("4h 8d Kc"))
    assert result.laid_off == ()
    assert result.points == 22


def test_r7_1_chains_4h5h6h_takes_7h_then_8h():
    result = best_layoffs([p("4h 5h 6h")], p("7h 8h Kc"))
    assert laid(result) == [("7h", 0), ("8h", 0)]
    assert strs(result.deadwood) == ["Kc"]
    assert result.points == 10


def test_r7_1_chain_needs_its_first_link():
    # 8h alone does not touch 4h5h6h
    result = best_layoffs([p("4h 5h 6h")], p("8h Kc"))
    assert result.laid_off == ()
    assert result.points == 18


def test_r7_1_trap_chains_do_not_stop_at_two_7d8d9d_takes_td_jd_qd():
    ways = extensions(p("7d 8d 9d"), mask_of(p("Td Jd Qd 2c")))
    assert ways == [(), p("Td"), p("Td Jd"), p("Td Jd Qd")]
    # and below the run, three deep as well
    ways = extensions(p("7d 8d 9d"), mask_of(p("4d 5d 6d")))
    assert p("6d 5d 4d") in ways


def test_r7_1_trap_three_card_chain_is_counted_as_laid_off_deadwood():
    # Td Jd Qd laid off (or kept as a run: the same 0); only 2c is left
    result = best_layoffs([p("7d 8d 9d")], p("Td Jd Qd 2c"))
    assert result.points == 2
    assert strs(result.deadwood) == ["2c"]


@pytest.mark.parametrize(
    ("meld", "defender"),
    [("Jh Qh Kh", "Ah"), ("Ah 2h 3h", "Kh"), ("Qs Ks", "As")],
)
def test_r7_1_the_ace_never_goes_above_a_king(meld, defender):
    if len(p(meld)) < 3:  # Q-K alone is no meld; J-Q-K is
        meld = "Js " + meld
    result = best_layoffs([p(meld)], p(defender))
    assert result.laid_off == ()
    assert result.points == parse_cards(defender)[0].points


# --- section 12 layoff vectors ----------------------------------------------------------


def test_r12_888_and_a234_hearts_take_the_fourth_8_and_5h():
    result = best_layoffs([p("8c 8d 8s"), p("Ah 2h 3h 4h")], p("8h 5h 6d 7c Kc Kd Kh"))
    assert sorted(laid(result)) == [("5h", 1), ("8h", 0)]
    assert strs(result.deadwood) == ["7c", "6d"]
    assert result.points == 13


def test_r12_789d_takes_td_and_a_set_of_4s_takes_the_fourth_4():
    result = best_layoffs([p("7d 8d 9d"), p("4c 4h 4s")], p("Td 4d 6c 6h 6s 2h 3c 5s 9s Th"))
    assert sorted(laid(result)) == [("4d", 1), ("Td", 0)]
    assert result.points == 2 + 3 + 5 + 9 + 10


def test_r12_4h5h6h_takes_7h_then_8h():
    result = best_layoffs([p("4h 5h 6h")], p("7h 8h 2c 3d"))
    assert laid(result) == [("7h", 0), ("8h", 0)]
    assert result.points == 5


def test_r12_knock_with_6_defender_left_with_21_knocker_scores_15():
    # knocker: 4h5h6h 7c7d7s TsJsQs + 6c (6). Defender: 2s3s4s5s, lays off 3h 7h 9s,
    # keeps Jc 9c 2d = 21.
    record = knock_as_non_dealer(
        "4h 5h 6h 7c 7d 7s Ts Js Qs 6c", "3h 7h 9s Jc 9c 2d 2s 3s 4s 5s", junk="Qd"
    )
    assert record.how == "knock"
    assert record.seats[0].points == 6
    assert record.seats[1].points == 21
    assert sorted(x.card for x in record.layoffs) == ["3h", "7h", "9s"]
    assert record.winner == 0
    assert record.points == 15
    assert record.scores == [15, 0]


def test_r12_888_a234_vector_through_a_knock():
    record = knock_as_non_dealer(
        "8c 8d 8s Ah 2h 3h 4h 2c 3d 5s", "8h 5h Kc Kd Kh 9s Ts Js 6d 7c", junk="Qd"
    )
    assert record.seats[0].points == 10
    assert sorted(x.card for x in record.layoffs) == ["5h", "8h"]
    assert record.seats[1].deadwood == ["7c", "6d"]
    assert record.seats[1].points == 13
    assert record.points == 3


# --- R7.2: the defender's best answer ---------------------------------------------------


def test_r7_2_a_card_is_worth_more_laid_off_than_kept_in_the_defenders_run():
    # alone the defender would keep TdJdQdKd (Qc Qh = 20); laying off Td Jd and melding
    # Qc Qd Qh leaves only Kd (10)
    result = best_layoffs([p("7d 8d 9d")], p("Td Jd Qd Kd Qc Qh"))
    assert laid(result) == [("Td", 0), ("Jd", 0)]
    assert [strs(m) for m in result.melds] == [["Qc", "Qd", "Qh"]]
    assert strs(result.deadwood) == ["Kd"]
    assert result.points == 10


def test_r7_2_equally_good_choices_take_the_fewest_layoffs():
    # laying off Td Jd Qd or keeping them as a run both leave Kc: keep the run
    result = best_layoffs([p("7d 8d 9d")], p("Td Jd Qd Kc"))
    assert result.laid_off == ()
    assert [strs(m) for m in result.melds] == [["Td", "Jd", "Qd"]]
    assert result.points == 10


def test_r7_2_layoffs_on_two_melds_of_the_same_suit():
    result = best_layoffs([p("2h 3h 4h"), p("8h 9h Th")], p("5h 7h 6c Kc"))
    assert sorted(laid(result)) == [("5h", 0), ("7h", 1)]
    assert result.points == 16


def test_r7_2_layoffs_are_automatic_in_a_knock():
    # the defender sends nothing: the record already holds the layoffs
    record = knock_as_non_dealer(
        "4h 5h 6h 7c 7d 7s Ts Js Qs 6c", "3h 7h 9s Jc 9c 2d 2s 3s 4s 5s", junk="Qd"
    )
    assert record.layoffs
    assert all(x.by == 1 for x in record.layoffs)


# --- R7.3: who never lays off -----------------------------------------------------------


def test_r7_3_the_knocker_never_lays_off_on_the_defenders_melds():
    # the knocker's 5s would extend the defender's 2s3s4s: it stays deadwood
    record = knock_as_non_dealer(
        "Ac 2c 3c 7d 8d 9d Th Jh Qh 5s", "2s 3s 4s 6c 6d 6h Kc Kd 9s Ts", junk="Qs"
    )
    assert record.how == "knock"
    assert record.seats[0].deadwood == ["5s"]
    assert record.seats[0].points == 5
    assert record.layoffs == []
    assert record.seats[1].points == 39
    assert record.points == 34


def test_r7_3_nobody_lays_off_against_gin():
    # the defender's 4c, 3d and Jh would all fit the knocker's runs
    record = knock_as_non_dealer(
        "Ac 2c 3c 4d 5d 6d 7h 8h 9h Th", "4c 3d Jh Kc Kd Kh 5s 6s 7s 9c", junk="Qd"
    )
    assert record.how == "gin"
    assert record.layoffs == []
    assert record.seats[1].deadwood == ["4c", "9c", "3d", "Jh"]
    assert record.seats[1].points == 26
    assert record.points == 25 + 26


def test_r7_3_nobody_lays_off_against_big_gin():
    deck = rigged_deck(
        "Ac 2c 3c 4d 5d 6d 7h 8h 9h Th", "4c 3d Qs Kc Kd Kh 5s 6s 7s 9c", upcard="Jh"
    )
    state = play_all(start(deck, dealer=1), c.TakeUpcard())
    _, events = play(state, c.BigGin())
    record = events[0]
    assert record.how == "big_gin"
    assert record.layoffs == []
    assert record.seats[1].points == 4 + 3 + 10 + 9


# --- R7.4: the record of the layoffs ----------------------------------------------------

AJUNTOU_KNOCKER = "Ac 2c 3c 8d 8h 8s 5h 6h 7h 2d"
AJUNTOU_DEFENDER = "4c 8c 9h Kd Qd Jd 3s 5s 9s Ts"


def test_r7_4_record_lists_every_laid_off_card_and_who_laid_it():
    record = knock_as_non_dealer(AJUNTOU_KNOCKER, AJUNTOU_DEFENDER, junk="Qh")
    assert sorted((x.card, x.by) for x in record.layoffs) == [("4c", 1), ("8c", 1)]
    assert record.seats[0].melds == [["Ac", "2c", "3c"], ["8d", "8h", "8s"], ["5h", "6h", "7h"]]
    assert record.seats[1].points == 9 + 3 + 5 + 9 + 10
    assert "4c" not in record.seats[1].deadwood
    assert "8c" not in record.seats[1].deadwood


def test_r7_4_layoff_meld_index_points_at_the_meld_in_the_record():
    record = knock_as_non_dealer(AJUNTOU_KNOCKER, AJUNTOU_DEFENDER, junk="Qh")
    melds = record.seats[0].melds
    placed = {x.card: melds[x.meld] for x in record.layoffs}
    assert placed == {"4c": ["Ac", "2c", "3c"], "8c": ["8d", "8h", "8s"]}


def test_r7_4_layoff_meld_index_with_melds_sent_by_the_knocker():
    record = knock_as_non_dealer(
        AJUNTOU_KNOCKER,
        AJUNTOU_DEFENDER,
        junk="Qh",
        melds=["5h 6h 7h", "8d 8h 8s", "Ac 2c 3c"],
    )
    melds = record.seats[0].melds
    placed = {x.card: melds[x.meld] for x in record.layoffs}
    assert placed == {"4c": ["Ac", "2c", "3c"], "8c": ["8d", "8h", "8s"]}
