"""Cards, melds, deadwood and the best arrangement: docs/RULES.md sections 1 and 2 (and R6.5)."""

from __future__ import annotations

import random

import pytest

from shared.contracts import commands as c
from shared.contracts.options import TableOptions
from shared.engine import (
    CARDS,
    IllegalAction,
    Timing,
    best_arrangement,
    best_discard,
    deal,
    is_meld,
    legal,
    new_game,
    parse_card,
    parse_cards,
    view,
)
from shared.engine.cards import mask_of
from shared.engine.melds import knock_options
from tests.engine.helpers import PASS, STOCK, play, play_all, rigged_deck, start


def p(text: str) -> tuple[int, ...]:
    return tuple(int(card) for card in parse_cards(text))


# --- R1: cards ------------------------------------------------------------------------


def test_r1_1_one_deck_of_52_distinct_cards_no_jokers():
    names = [str(card) for card in CARDS]
    assert len(names) == 52
    assert len(set(names)) == 52
    assert {name[0] for name in names} == set("A23456789TJQK")
    assert {name[1] for name in names} == set("cdhs")


@pytest.mark.parametrize(
    "deck",
    [
        list(range(51)),  # a card short
        [*range(52), 0],  # 53 cards
        [0, *range(51)],  # a card twice, one missing
    ],
)
def test_r1_1_deal_refuses_anything_but_the_52_cards(deck):
    state, _ = new_game(TableOptions(), Timing(now=0))
    with pytest.raises(IllegalAction) as info:
        deal(state, deck, "salt", 0, Timing(now=0))
    assert info.value.code == "bad_deck"


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("Ah", "Ah"),
        ("ah", "Ah"),
        ("AH", "Ah"),
        ("7c", "7c"),
        ("7C", "7c"),
        ("Td", "Td"),
        ("td", "Td"),
        ("10d", "Td"),
        ("10D", "Td"),
        ("Ks", "Ks"),
        ("kS", "Ks"),
    ],
)
def test_r1_2_card_text_is_parsed_case_insensitively_and_printed_canonically(text, canonical):
    card = parse_card(text)
    assert str(card) == canonical
    assert int(card) == "cdhs".index(canonical[1]) * 13 + "A23456789TJQK".index(canonical[0])


@pytest.mark.parametrize("text", ["1h", "11h", "Xh", "Ax", "A", "Ahh", "", "10", "0h"])
def test_r1_2_bad_card_text_is_refused(text):
    with pytest.raises(IllegalAction) as info:
        parse_card(text)
    assert info.value.code == "unknown_card"
    assert info.value.rule == "R1.2"


def test_r1_2_parse_cards_accepts_spaces_and_commas():
    assert [str(x) for x in parse_cards("Ah 7c, 10d,ks")] == ["Ah", "7c", "Td", "Ks"]


@pytest.mark.parametrize(
    ("text", "points"),
    [("Ac", 1), ("2d", 2), ("9h", 9), ("Ts", 10), ("Jc", 10), ("Qd", 10), ("Kh", 10)],
)
def test_r1_3_point_values(text, points):
    assert parse_card(text).points == points


def test_r1_3_deadwood_adds_point_values():
    # no melds: 1 + 5 + 10 + 10 + 10 + 10
    assert best_arrangement(p("Ac 5d Th Jh Qs Kc")).points == 46


def test_r1_4_ace_is_low_a23_is_a_run():
    assert is_meld(p("Ac 2c 3c"))
    arrangement = best_arrangement(p("Ah 2h 3h Kc"))
    assert [[str(x) for x in m] for m in arrangement.melds] == [["Ah", "2h", "3h"]]
    assert arrangement.points == 10


@pytest.mark.parametrize("text", ["Qc Kc Ac", "Kc Ac 2c", "Jd Qd Kd Ad", "Ks As 2s 3s"])
def test_r1_4_runs_do_not_wrap_around_the_king(text):
    assert not is_meld(p(text))


def test_r1_4_qka_is_no_meld_so_it_is_all_deadwood():
    arrangement = best_arrangement(p("Qh Kh Ah"))
    assert arrangement.melds == ()
    assert arrangement.points == 21


# --- R2: melds and deadwood -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "meld"),
    [
        ("7c 7d 7h", True),
        ("7c 7d 7s", True),
        ("7c 7d 7h 7s", True),
        ("7c 7d", False),
        ("7c 7d 8h", False),
        ("7c 7c 7d", False),
    ],
)
def test_r2_1_a_set_is_three_or_four_of_a_rank(text, meld):
    assert is_meld(p(text)) is meld


@pytest.mark.parametrize(
    ("text", "meld"),
    [
        ("4c 5c 6c", True),
        ("4c 5c 6c 7c 8c 9c Tc", True),
        ("6c 4c 5c", True),  # order does not matter
        ("4c 5c", False),
        ("4c 5c 7c", False),
        ("4c 5d 6c", False),
        ("Jd Qd Kd", True),
    ],
)
def test_r2_2_a_run_is_three_or_more_consecutive_of_a_suit(text, meld):
    assert is_meld(p(text)) is meld


def test_r2_3_a_card_belongs_to_one_meld_only():
    # 7h cannot serve both 5h6h7h and 7c7d7h: the set leaves 5h 6h (11), the run 7c 7d (14)
    arrangement = best_arrangement(p("5h 6h 7h 7c 7d"))
    assert [[str(x) for x in m] for m in arrangement.melds] == [["7c", "7d", "7h"]]
    assert [str(x) for x in arrangement.deadwood] == ["5h", "6h"]
    assert arrangement.points == 11
    used = [card for meld in arrangement.melds for card in meld]
    assert len(used) == len(set(used))


def test_r2_3_deadwood_is_the_cards_outside_melds():
    arrangement = best_arrangement(p("4c 5c 6c 9h 9d 9s Kh 2s"))
    assert [str(x) for x in arrangement.deadwood] == ["Kh", "2s"]
    assert arrangement.points == 12


def test_r2_4_best_arrangement_is_the_lowest_deadwood():
    # the four 7s as a set leave 5c 6c 5s 6s (22); two runs leave 7d 7h (14);
    # 5c6c7c + 7d7h7s leaves 5s 6s (11): the lowest
    arrangement = best_arrangement(p("5c 6c 7c 7d 7h 7s 5s 6s"))
    assert arrangement.points == 11


def test_r2_4_ties_go_to_the_canonical_order():
    # 5c6c7c + 7d7h7s (deadwood 5s 6s) and 5s6s7s + 7c7d7h (deadwood 5c 6c) both leave 11 and
    # offer two layoff spots each; the canonical order (suit, then rank) puts 5c6c7c first.
    cards = p("5c 6c 7c 7d 7h 7s 5s 6s")
    expected = [["5c", "6c", "7c"], ["7d", "7h", "7s"]]
    for order in (cards, cards[::-1], tuple(random.Random(4).sample(cards, len(cards)))):
        arrangement = best_arrangement(order)
        assert [[str(x) for x in m] for m in arrangement.melds] == expected
        assert [str(x) for x in arrangement.deadwood] == ["5s", "6s"]


def test_r2_4_melds_are_listed_by_suit_then_rank():
    arrangement = best_arrangement(p("Kh Qh Jh 9s 9c 9d 4c 3c 2c"))
    assert [[str(x) for x in m] for m in arrangement.melds] == [
        ["2c", "3c", "4c"],
        ["9c", "9d", "9s"],
        ["Jh", "Qh", "Kh"],
    ]


# --- R2.5 and the discard trap --------------------------------------------------------

TRAP = "2d 3c 3h 4d 4h 5c 5d 5h 6c 6d 6h"


def test_r6_5_trap_best_discard_6c_leaves_deadwood_10():
    # discarding 6c keeps 3h4h5h6h + 4d5d6d with 2d 3c 5c = 10: a legal knock
    card, deadwood = best_discard(mask_of(p(TRAP)))
    assert str(card) == "6c"
    assert deadwood == 10
    assert knock_options(mask_of(p(TRAP)), 0, 10) == [(parse_card("6c"), 10)]
    kept = best_arrangement(p(TRAP.replace("6c ", "")))
    assert kept.points == 10
    assert [[str(x) for x in m] for m in kept.melds] == [
        ["4d", "5d", "6d"],
        ["3h", "4h", "5h", "6h"],
    ]


def test_r2_5_view_with_10_cards_is_the_best_arrangement():
    deck = rigged_deck(
        "4c 5c 6c 9h 9d 9s Kh 2s Jd 3d", "Ac 2c 3c 7d 8d 9c Th Jh Qh 5s", upcard="Kd"
    )
    state = start(deck, dealer=1)
    arrangement = view(state, 0)[1].my_arrangement
    assert arrangement.melds == [["4c", "5c", "6c"], ["9d", "9h", "9s"]]
    assert arrangement.deadwood == ["3d", "Jd", "Kh", "2s"]
    assert arrangement.points == 25
    assert arrangement.discard is None


def test_r2_5_view_with_11_cards_names_the_discard_and_agrees_with_the_knock():
    deck = rigged_deck(TRAP.replace("6c ", ""), "Ac 2c 7c 8d 9c Th Jh Qh 5s Ks", "Kd", stock="6c")
    state = play_all(start(deck, dealer=1), PASS, PASS, STOCK)
    arrangement = view(state, 0)[1].my_arrangement
    assert arrangement.discard == "6c"
    assert arrangement.points == 10
    assert arrangement.deadwood == ["3c", "5c", "2d"]
    knocks = [x for x in legal(state, 0, Timing(now=0)) if isinstance(x, c.Knock)]
    assert [(x.card, x.deadwood) for x in knocks] == [("6c", 10)]
    _, events = play(state, c.Knock())
    record = events[0]
    assert record.how == "knock"
    assert record.knock_discard == "6c"
    assert record.seats[0].points == 10


def test_r2_5_with_11_cards_the_view_never_suggests_the_card_just_taken():
    # discarding Kc or Ks leaves 10; Ks would be chosen (R6.5), but Ks was just taken
    deck = rigged_deck(
        "Ac 2c 3c 4d 5d 6d 7h 8h 9h Kc", "Qc Qd Jh Ts 9c 8d 7s 6c 5h 4s", upcard="Ks"
    )
    state = play_all(start(deck, dealer=1), c.TakeUpcard())
    arrangement = view(state, 0)[1].my_arrangement
    assert arrangement.discard == "Kc"
    assert arrangement.points == 10
    assert arrangement.deadwood == ["Ks"]


def test_r12_qka_is_not_a_run_a23_is():
    assert not is_meld(p("Qd Kd Ad"))
    assert is_meld(p("Ad 2d 3d"))
    assert best_arrangement(p("Qd Kd Ad 2d 3d")).melds == (p("Ad 2d 3d"),)
    assert best_arrangement(p("Qd Kd Ad 2d 3d")).points == 20


def test_r1_2_commands_accept_any_spelling_and_records_use_the_canonical_one():
    deck = rigged_deck(
        "Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s", "Jc Jd Js Qc Qd Qs 2s 3s 4s Kh", "Kd", stock="Ad 2d 3d"
    )
    state = play_all(start(deck, dealer=1), c.PassUpcard(), c.PassUpcard())
    state, events = play(state, c.Draw(source="stock"))  # the stock's top: Ad
    state, events = play(state, c.Discard(card="aD"))
    assert events[0].card == "Ad"
    state = play_all(state, c.Draw(source="stock"), c.Discard(card="2D"))
    state, _ = play(state, c.Draw(source="stock"))  # 3d
    _, events = play(state, c.Knock(card="3D"))
    assert events[0].knock_discard == "3d"
    assert "9s" in events[0].seats[0].deadwood
