"""A hand from deal to end: docs/RULES.md sections 3 to 6 and 8."""

from __future__ import annotations

import hashlib
import random

import pytest

from shared.contracts import commands as c
from shared.contracts.events import (
    CardDiscarded,
    CardDrawn,
    HandEnded,
    HandStarted,
    StockLow,
    UpcardPassed,
    UpcardTaken,
)
from shared.contracts.options import TableOptions
from shared.engine import (
    IllegalAction,
    Timing,
    apply,
    deal,
    deck_commitment,
    legal,
    new_game,
    parse_cards,
    view,
)
from shared.engine.cards import CARDS, mask_of
from shared.engine.state import STOCK_START
from tests.engine.helpers import (
    PASS,
    PILE,
    SALT,
    STOCK,
    TAKE,
    after_first_draw,
    knock,
    play,
    play_all,
    play_to_dead_hand,
    refuse,
    rigged_deck,
    sorted_texts,
    start,
)

GIN = "Ac 2c 3c 4d 5d 6d 7h 8h 9h Th"  # all melded
JUNK = "Kc Qd Js Ts 9c 8d 7s 6c 5h 4s"  # no meld, 79 points, nothing to lay off on GIN
T0 = Timing(now=0.0)


def my_cards(state, seat):
    return view(state, seat)[1].my_cards


# --- R3: deal and dealer ----------------------------------------------------------------


@pytest.mark.parametrize("dealer", [0, 1])
def test_r3_1_deal_alternates_from_the_non_dealer_then_upcard_then_stock(dealer):
    deck = random.Random(31 + dealer).sample(range(52), 52)
    state, _ = new_game(TableOptions(), T0)
    state, events = deal(state, deck, SALT, dealer, T0)
    non_dealer = 1 - dealer
    assert sorted(parse_cards(" ".join(my_cards(state, non_dealer)))) == sorted(deck[0:20:2])
    assert sorted(parse_cards(" ".join(my_cards(state, dealer)))) == sorted(deck[1:20:2])
    started = events[0]
    assert isinstance(started, HandStarted)
    assert started.upcard == str(CARDS[deck[20]])
    assert started.stock_count == 31
    hand_view = view(state, non_dealer)[1]
    assert hand_view.discard_pile == [str(CARDS[deck[20]])]
    assert hand_view.stock_count == 31
    assert hand_view.card_counts == [10, 10]
    # both pass: the non-dealer draws deck[21], then the dealer deck[22]
    state = play_all(state, PASS, PASS, STOCK)
    assert str(CARDS[deck[21]]) in my_cards(state, non_dealer)
    assert len(my_cards(state, non_dealer)) == 11
    state = play_all(state, c.Discard(card=str(CARDS[deck[21]])), STOCK)
    assert str(CARDS[deck[22]]) in my_cards(state, dealer)
    assert view(state, dealer)[1].stock_count == 29


@pytest.mark.parametrize("lot", [0, 1])
def test_r3_2_first_dealer_is_the_lot(lot):
    state, _ = new_game(TableOptions(), T0)
    state, events = deal(state, list(range(52)), SALT, lot, T0)
    assert events[0].dealer == lot
    assert events[0].reason == "lot"
    assert state.hand.dealer == lot
    assert state.hand.to_act == 1 - lot


def test_r3_2_lot_must_name_a_seat():
    state, _ = new_game(TableOptions(), T0)
    with pytest.raises(IllegalAction) as info:
        deal(state, list(range(52)), SALT, 2, T0)
    assert info.value.code == "bad_lot"


def test_r3_1_no_deal_while_a_hand_is_on():
    state = start(list(range(52)))
    with pytest.raises(IllegalAction) as info:
        deal(state, list(range(52)), SALT, 0, T0)
    assert info.value.code == "no_deal_due"


def _knock_first_turn(state, knocker, defender, junk, lot=0):
    """Deal with the knocker as the non-dealer, who draws ``junk`` and knocks with it."""
    dealer = lot if state.next_dealer is None else state.next_dealer
    deck = rigged_deck(knocker, defender, upcard="Kd", stock=junk)
    state, started = deal(state, deck, SALT, lot, T0)
    state = play_all(state, PASS, PASS, STOCK)
    state, events = play(state, knock(card=junk))
    assert started[0].dealer == dealer
    return state, started[0], events[0]


WIN9 = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s"  # 9 points of deadwood
LOSE10 = "Jc Jd Js Qc Qd Qs 2s 3s 4s Kh"  # 10 points, nothing to lay off on WIN9
KNOCK5 = "Ac 2c 3c 7d 8d 9d Th Jh Qh 5s"  # 5 points
UNDERCUT5 = "4c Kh 5d 8s 9s Ts Js 6c 6h 6s"  # lays off 4c and Kh: 5 points left


def test_r3_3_the_winner_of_a_hand_deals_the_next():
    state, _ = new_game(TableOptions(), T0)
    state, _, record = _knock_first_turn(state, WIN9, LOSE10, "Kc", lot=1)  # seat 0 knocks
    assert (record.how, record.winner) == ("knock", 0)
    state, started = deal(state, list(range(52)), SALT, 1, T0)  # the lot no longer counts
    assert (started[0].dealer, started[0].reason) == (0, "won_previous_hand")


def test_r3_3_the_winner_of_an_undercut_deals_the_next():
    state, _ = new_game(TableOptions(), T0)
    state, _, record = _knock_first_turn(state, KNOCK5, UNDERCUT5, "Kc", lot=1)
    assert (record.how, record.winner) == ("undercut", 1)
    state, started = deal(state, list(range(52)), SALT, 0, T0)
    assert (started[0].dealer, started[0].reason) == (1, "won_previous_hand")


@pytest.mark.parametrize("rule", ["winner", "loser", "alternate"])
def test_r3_3_after_a_dead_hand_the_same_dealer_deals_whatever_the_option(rule):
    state = start(list(range(52)), dealer=1, options=TableOptions(dealer=rule))
    state, _ = play_to_dead_hand(state)
    state, started = deal(state, list(range(52)), SALT, 0, T0)
    assert (started[0].dealer, started[0].reason) == (1, "dead_hand_redeal")


@pytest.mark.parametrize(
    ("rule", "knocker_deals", "dealer", "reason"),
    [
        ("winner", False, 0, "won_previous_hand"),
        ("loser", False, 1, "lost_previous_hand"),
        ("alternate", False, 0, "alternate"),
        ("winner", True, 0, "won_previous_hand"),
        ("loser", True, 1, "lost_previous_hand"),
        ("alternate", True, 1, "alternate"),
    ],
)
def test_r3_4_hand_start_announces_dealer_reason_and_knock_limit(
    rule, knocker_deals, dealer, reason
):
    # seat 0 wins hand 1, as the non-dealer (seat 1 dealt) or as the dealer (seat 0 dealt)
    state, _ = new_game(TableOptions(dealer=rule), T0)
    if knocker_deals:
        deck = rigged_deck(LOSE10, WIN9, upcard="Kd", stock="Kc Ks")
        state, first = deal(state, deck, SALT, 0, T0)
        state = play_all(state, PASS, PASS, STOCK, c.Discard(card="Kc"), STOCK)
        state, events = play(state, knock(card="Ks"))
    else:
        state, first, record = _knock_first_turn(state, WIN9, LOSE10, "Kc", lot=1)
        first, events = [first], [record]
    assert (first[0].reason, first[0].knock_limit) == ("lot", 10)
    assert events[0].winner == 0
    _, started = deal(state, list(range(52)), SALT, 0, T0)
    assert (started[0].dealer, started[0].reason, started[0].knock_limit) == (dealer, reason, 10)


def test_r3_5_same_deck_and_moves_replay_the_same_hand():
    deck = random.Random(35).sample(range(52), 52)

    def replay():
        state, log = new_game(TableOptions(), T0)
        state, events = deal(state, deck, "seed-35", 0, T0)
        log += events
        rng = random.Random(7)
        for _ in range(12):
            seat = state.hand.to_act
            moves = [m for m in legal(state, seat, T0) if not isinstance(m, c.Resign | c.Leave)]
            state, events = apply(state, seat, rng.choice(moves), T0)
            log += events
            if state.hand is None:
                break
        return state, log

    assert replay() == replay()


def test_r3_5_deck_commitment_is_sha256_of_the_deck_text_and_salt():
    deck = random.Random(5).sample(range(52), 52)
    text = " ".join(str(CARDS[x]) for x in deck) + ":" + "salty"
    assert deck_commitment(deck, "salty") == hashlib.sha256(text.encode()).hexdigest()
    assert deck_commitment(deck, "salty") != deck_commitment(deck, "other")
    state, _ = new_game(TableOptions(), T0)
    _, events = deal(state, deck, "salty", 0, T0)
    assert events[0].deck_commitment == hashlib.sha256(text.encode()).hexdigest()


# --- R4: the upcard ---------------------------------------------------------------------


def test_r4_1_the_non_dealer_decides_first():
    state = start(list(range(52)), dealer=0)
    assert view(state, 1)[1].phase == "upcard"
    assert legal(state, 1, T0)[:2] == [c.TakeUpcard(), c.PassUpcard()]
    refuse(state, 0, TAKE, "not_your_turn")
    refuse(state, 0, PASS, "not_your_turn")
    refuse(state, 1, STOCK, "upcard_pending")
    refuse(state, 1, c.Discard(card=my_cards(state, 1)[0]), "upcard_pending")


def test_r4_2_after_the_non_dealer_passes_the_dealer_decides():
    deck = rigged_deck(GIN, JUNK, upcard="Qc")
    state = start(deck, dealer=0)
    state, events = play(state, PASS)
    assert events == [UpcardPassed(hand=1, seat=1)]
    assert (state.hand.to_act, state.hand.phase) == (0, "upcard")
    refuse(state, 1, TAKE, "not_your_turn")
    state, events = play(state, TAKE)
    assert events == [UpcardTaken(hand=1, seat=0, card="Qc")]
    assert "Qc" in my_cards(state, 0)
    assert view(state, 0)[1].discard_pile == []


def test_r4_3_the_taker_discards_any_card_but_the_upcard_then_a_normal_turn():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h")
    state = start(deck, dealer=1)
    state, _ = play(state, TAKE)
    assert (state.hand.to_act, state.hand.phase) == (0, "discard")
    refuse(state, 0, c.Discard(card="Qc"), "card_just_taken")
    state, events = play(state, c.Discard(card="Th"))
    assert events[0] == CardDiscarded(hand=1, seat=0, card="Th")
    assert (state.hand.to_act, state.hand.phase) == (1, "draw")
    # a normal turn: the dealer may take the discard just made
    assert c.Draw(source="discard") in legal(state, 1, T0)
    state, events = play(state, PILE)
    assert events[0].card == "Th"
    assert "Th" in my_cards(state, 1)


def test_r4_3_the_dealer_may_take_the_upcard_after_a_pass():
    deck = rigged_deck(JUNK, GIN, upcard="Qc")
    state = play_all(start(deck, dealer=1), PASS, TAKE, c.Discard(card="Th"))
    assert (state.hand.to_act, state.hand.phase) == (0, "draw")
    assert view(state, 0)[1].discard_pile == ["Th"]
    assert c.Draw(source="discard") in legal(state, 0, T0)


def test_r4_4_both_pass_non_dealer_draws_from_the_stock_only():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h")
    state = play_all(start(deck, dealer=1), PASS)
    state, events = play(state, PASS)
    assert events == [UpcardPassed(hand=1, seat=1, reason="both_passed_upcard")]
    assert (state.hand.to_act, state.hand.phase, state.hand.stock_only) == (0, "draw", True)
    assert c.Draw(source="discard") not in legal(state, 0, T0)
    error = refuse(state, 0, PILE, "stock_only")
    assert error.rule == "R4.4"
    state, _ = play(state, STOCK)
    assert "2h" in my_cards(state, 0)
    state, _ = play(state, c.Discard(card="2h"))
    # the restriction was for that one turn: the dealer may take from the pile
    assert c.Draw(source="discard") in legal(state, 1, T0)


# --- R5: a normal turn ------------------------------------------------------------------


def test_r5_1_draw_exactly_one_card_from_stock_or_pile():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h 3s")
    state = play_all(start(deck, dealer=1), TAKE, c.Discard(card="Th"))
    refuse(state, 1, c.Discard(card="Kc"), "must_draw_first")
    refuse(state, 1, knock(), "must_draw_first")
    state, events = play(state, STOCK)
    assert events == [CardDrawn(hand=1, seat=1, source="stock", stock_count=30)]
    assert len(my_cards(state, 1)) == 11
    refuse(state, 1, STOCK, "already_drawn")
    refuse(state, 1, PILE, "already_drawn")


def test_r5_2_a_discard_ends_the_turn():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h 3s")
    state = play_all(start(deck, dealer=1), PASS, PASS, STOCK)
    refuse(state, 0, c.Discard(card="Kc"), "card_not_in_hand")
    refuse(state, 0, c.Discard(card="Zz"), "unknown_card")
    state, events = play(state, c.Discard(card="2h"))
    assert events == [CardDiscarded(hand=1, seat=0, card="2h")]
    assert view(state, 0)[1].discard_pile == ["Qc", "2h"]
    assert (state.hand.to_act, state.hand.phase) == (1, "draw")
    assert len(my_cards(state, 0)) == 10


def test_r5_3_a_card_from_the_pile_may_not_go_back_this_turn():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h")
    state = play_all(start(deck, dealer=1), PASS, PASS, STOCK, c.Discard(card="2h"))
    state, _ = play(state, PILE)
    refuse(state, 1, c.Discard(card="2h"), "card_just_taken")
    refuse(state, 1, knock(card="2h"), "card_just_taken")
    assert c.Discard(card="2h") not in legal(state, 1, T0)
    state, _ = play(state, c.Discard(card="Kc"))
    assert view(state, 0)[1].discard_pile == ["Qc", "Kc"]


def test_r5_3_a_card_from_the_stock_may_be_discarded_at_once():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h")
    state = play_all(start(deck, dealer=1), PASS, PASS, STOCK)
    assert c.Discard(card="2h") in legal(state, 0, T0)
    state, events = play(state, c.Discard(card="2h"))
    assert events[0].card == "2h"


def test_r5_4_the_turn_passes_to_the_other_player():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h 3s")
    state = play_all(start(deck, dealer=1), PASS, PASS, STOCK, c.Discard(card="2h"))
    assert state.hand.to_act == 1
    refuse(state, 0, STOCK, "not_your_turn")
    refuse(state, 0, c.Discard(card="Ac"), "not_your_turn")
    refuse(state, 0, knock(), "not_your_turn")
    refuse(state, 0, c.BigGin(), "not_your_turn")
    state = play_all(state, STOCK, c.Discard(card="3s"))
    assert state.hand.to_act == 0


def test_r5_5_gin_is_not_compulsory():
    deck = rigged_deck(GIN, JUNK, upcard="Qc", stock="2h")
    state = play_all(start(deck, dealer=1), PASS, PASS, STOCK)
    assert c.Knock(card="2h", deadwood=0) in legal(state, 0, T0)
    state, events = play(state, c.Discard(card="2h"))
    assert state.hand is not None
    assert not any(isinstance(e, HandEnded) for e in events)


def test_r5_5_big_gin_is_not_compulsory():
    deck = rigged_deck(GIN, JUNK, upcard="Jh")
    state = play_all(start(deck, dealer=1), TAKE)
    assert c.BigGin() in legal(state, 0, T0)
    state, _ = play(state, c.Discard(card="7h"))
    assert state.hand is not None
    assert state.hand.to_act == 1


# --- R6: knock, gin, big gin -------------------------------------------------------------


def test_r6_0_the_knock_limit_is_10_by_default():
    deck = rigged_deck(GIN, JUNK, upcard="Qc")
    state, _ = new_game(TableOptions(), T0)
    state, events = deal(state, deck, SALT, 0, T0)
    assert events[0].knock_limit == 10
    assert state.hand.knock_limit == 10
    assert view(state, 0)[1].knock_limit == 10


def test_r6_1_knock_right_after_taking_the_upcard_discard_goes_face_down():
    # 9 points of deadwood (9s) after taking the upcard 2h and knocking with Ks
    deck = rigged_deck("Ac 2c 3c 4d 5d 6d 7h 8h 9s Ks", LOSE10, upcard="9h")
    state = play_all(start(deck, dealer=1), TAKE)
    refuse(state, 0, knock(card="9h"), "card_just_taken")
    state, events = play(state, knock(card="Ks"))
    assert [type(e) for e in events] == [HandEnded]  # no public discard
    record = events[0]
    assert record.how == "knock"
    assert record.knocker == 0
    assert record.knock_discard == "Ks"
    assert record.knock_discard_chosen_by_server is False
    assert "Ks" not in record.seats[0].cards + record.seats[1].cards
    assert record.seats[0].cards == sorted_texts("Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s")
    assert record.seats[0].points == 9
    assert record.points == 1


def test_r6_1_knock_on_the_first_normal_turn():
    state = after_first_draw(WIN9, LOSE10, "Kc")
    assert c.Knock(card="Kc", deadwood=9) in legal(state, 0, T0)
    _, events = play(state, knock(card="Kc"))
    assert events[0].how == "knock"
    assert events[0].winner == 0


def test_r6_2_gin_is_a_knock_leaving_no_deadwood():
    state = after_first_draw(GIN, JUNK, "Ks")
    _, events = play(state, knock(card="Ks"))
    record = events[0]
    assert record.how == "gin"
    assert record.seats[0].deadwood == []
    assert record.seats[0].melds == [
        ["Ac", "2c", "3c"],
        ["4d", "5d", "6d"],
        sorted_texts("7h 8h 9h Th"),
    ]
    assert record.points == 25 + 79


def test_r6_3_big_gin_shows_11_melded_cards_without_discarding():
    deck = rigged_deck(GIN, JUNK, upcard="Jh")
    state = play_all(start(deck, dealer=1), TAKE)
    state, events = play(state, c.BigGin())
    record = events[0]
    assert record.how == "big_gin"
    assert record.knock_discard is None
    assert record.seats[0].cards == sorted_texts(GIN + " Jh")
    assert record.seats[0].deadwood == []
    assert record.points == 31 + 79
    assert state.scores == (110, 0)


def test_r6_3_trap_big_gin_scores_31_not_a_gin_with_a_forced_discard():
    deck = rigged_deck(GIN, JUNK, upcard="Jh")
    state = play_all(start(deck, dealer=1), TAKE)
    _, big = play(state, c.BigGin())
    _, gin = play(state, knock(card="7h"))
    assert (big[0].how, big[0].points) == ("big_gin", 31 + 79)
    assert (gin[0].how, gin[0].points) == ("gin", 25 + 79)


def test_r6_3_big_gin_needs_11_melded_cards_after_drawing():
    deck = rigged_deck(GIN, JUNK, upcard="Jh", stock="2s")
    state = start(deck, dealer=1)
    refuse(state, 0, c.BigGin(), "upcard_pending")
    drawn = play_all(state, PASS, PASS)
    refuse(drawn, 0, c.BigGin(), "must_draw_first")
    drawn = play_all(drawn, STOCK)  # 2s does not meld
    error = refuse(drawn, 0, c.BigGin(), "not_big_gin")
    assert error.rule == "R6.3"
    assert c.BigGin() not in legal(drawn, 0, T0)


def test_r6_4_knocker_melds_offer_the_fewest_layoff_spots_whatever_the_defender_holds():
    # kept 2c3c4c 3d 3h 7h..Jh: the run 2c3c4c or the set 3c3d3h both leave 6; the set offers
    # one spot (3s), the run two (Ac, 5c). A defender holding Ac and 5c lays off nothing.
    knocker = "2c 3c 4c 3d 3h 7h 8h 9h Th Jh"
    for defender, laid, points in [
        ("3s Kc Kd Ks 5s 6s 7s 9c 9d Qc", ["3s"], 28 - 6),
        ("Ac 5c Kc Kd Ks 5s 6s 7s 9d Qc", [], 25 - 6),
    ]:
        state = after_first_draw(knocker, defender, "Qd")
        _, events = play(state, knock(card="Qd"))
        record = events[0]
        assert record.seats[0].melds == [["3c", "3d", "3h"], sorted_texts("7h 8h 9h Th Jh")]
        assert record.seats[0].deadwood == ["2c", "4c"]
        assert [x.card for x in record.layoffs] == laid
        assert record.points == points


KNOCK8 = "3c 4c 5c 6c 9d 9h 9s 2h 2s Ad"  # best: 3c-6c + 9s, deadwood 5
DEF38 = "Kc Kd Kh 5s 6s 7s Qc Qd Tc 8h"  # 38 points, nothing to lay off


def test_r6_4_explicit_melds_are_validated_and_used_as_sent():
    state = after_first_draw(KNOCK8, DEF38, "Js")
    _, events = play(state, knock(card="Js", melds=["4c 5c 6c", "9d 9h 9s"]))
    record = events[0]
    assert record.how == "knock"
    assert record.seats[0].melds == [["4c", "5c", "6c"], ["9d", "9h", "9s"]]
    assert record.seats[0].deadwood == ["3c", "Ad", "2h", "2s"]
    assert record.seats[0].points == 8
    assert record.points == 38 - 8
    # without melds the server lays the best arrangement (5)
    _, events = play(state, knock(card="Js"))
    assert events[0].seats[0].points == 5
    assert events[0].points == 38 - 5


@pytest.mark.parametrize(
    ("melds", "card", "code"),
    [
        (["3c 4c 6c", "9d 9h 9s"], "Js", "invalid_meld"),
        (["3c 4c 5c", "9d 9h 2h"], "Js", "invalid_meld"),
        (["3c 4c 5c 6c", "3c 4c 5c"], "Js", "overlapping_melds"),
        (["3c 4c 5c", "9d 9h 9s"], "Js", "knock_over_limit"),  # 6c 2h 2s Ad = 11
        (["3c 4c 5c 6c", "9d 9h 9s"], "9s", "discard_in_meld"),
        (["3c 4c 5c 6c", "9d 9h 9c"], "Js", "card_not_in_hand"),
        (["3c 4c 5c 6c", "9d 9h 9s"], "Kh", "card_not_in_hand"),
        ([], "Js", "knock_over_limit"),
    ],
)
def test_r6_4_invalid_explicit_melds_are_refused(melds, card, code):
    state = after_first_draw(KNOCK8, DEF38, "Js")
    refuse(state, 0, knock(card=card, melds=melds), code)


def test_r6_4_gin_whatever_arrangement_was_sent():
    state = after_first_draw(GIN, JUNK, "Ks")
    _, events = play(state, knock(card="Ks", melds=["Ac 2c 3c"]))
    record = events[0]
    assert record.how == "gin"
    assert record.seats[0].points == 0
    assert record.points == 25 + 79


@pytest.mark.parametrize(
    ("hand", "drawn", "discarded", "why"),
    [
        ("Ac 2c 3c 4d 5d 6d 7h 8h 9h Qs", "Kc", "Kc", "Kc or Qs keep 10: K is the higher rank"),
        ("Ac 2c 3c 4d 5d 6d 7h 8h 9h Qs", "Qc", "Qs", "Qc or Qs keep 10: spades is the last suit"),
        ("Ac 2c 3c 4d 5d 6d 7h 8h 9h Qs", "3s", "Qs", "the lowest deadwood first: 3"),
    ],
)
def test_r6_5_knock_without_a_card_discards_by_lowest_deadwood_then_tie_break(
    hand, drawn, discarded, why
):
    state = after_first_draw(hand, "Kh Qd Js Ts 9c 8d 7s 6c 5h 4s", drawn)
    assert view(state, 0)[1].my_arrangement.discard == discarded, why
    _, events = play(state, knock())
    record = events[0]
    assert record.knock_discard == discarded, why
    assert record.knock_discard_chosen_by_server is True
    assert discarded not in record.seats[0].cards


def test_r6_5_ties_go_to_the_card_of_highest_value():
    # after taking Jc: discarding 7h or Th keeps 10 (Jc may not go back); Th is worth more
    deck = rigged_deck(GIN, JUNK.replace("Js", "Jh"), upcard="Jc")
    state = play_all(start(deck, dealer=1), TAKE)
    assert view(state, 0)[1].my_arrangement.discard == "Th"
    _, events = play(state, knock())
    assert events[0].knock_discard == "Th"
    assert events[0].seats[0].deadwood == ["Jc"]
    assert events[0].seats[0].melds[2] == ["7h", "8h", "9h"]


def test_r6_5_auto_discard_is_never_the_card_just_taken():
    # Kc and Ks both leave 10 and Ks would win the tie, but Ks was just taken
    deck = rigged_deck("Ac 2c 3c 4d 5d 6d 7h 8h 9h Kc", LOSE10.replace("Kh", "Th"), "Ks")
    state = play_all(start(deck, dealer=1), TAKE)
    _, events = play(state, knock())
    record = events[0]
    assert record.knock_discard == "Kc"
    assert record.seats[0].deadwood == ["Ks"]


def test_r6_5_auto_discard_with_melds_sent_is_outside_them():
    state = after_first_draw(KNOCK8, DEF38, "Js")
    _, events = play(state, knock(melds=["3c 4c 5c 6c", "9d 9h 9s"]))
    assert events[0].knock_discard == "Js"
    assert events[0].knock_discard_chosen_by_server is True
    assert events[0].seats[0].points == 5


def test_r6_6_knock_over_the_limit_is_refused_and_nothing_changes():
    # 2s 2h 3s 4h Ks beside two melds: the best discard (Ks) still leaves 11
    state = after_first_draw("Ac 2c 3c 4d 5d 6d 2s 2h 3s 4h", DEF38, "Ks")
    error = refuse(state, 0, knock(card="Ks"), "knock_over_limit")
    assert error.rule == "R6.6"
    assert "11" in error.message
    refuse(state, 0, knock(), "knock_over_limit")
    assert not [x for x in legal(state, 0, T0) if isinstance(x, c.Knock)]


def test_r6_6_knock_at_exactly_the_limit_is_allowed():
    state = after_first_draw("Ac 2c 3c 4d 5d 6d 7h 8h 9h Tc", LOSE10.replace("Kh", "Ks"), "Kh")
    _, events = play(state, knock(card="Kh"))
    assert events[0].seats[0].points == 10
    assert events[0].how == "undercut"  # the defender's 10 ties the knocker's 10


# --- R8: dead hand --------------------------------------------------------------------


def test_r8_1_discard_leaving_two_in_the_stock_kills_the_hand():
    deck = rigged_deck(WIN9, LOSE10, upcard="Kd")
    state = start(deck, dealer=1, options=TableOptions())
    state, events = play_to_dead_hand(state)
    assert state.hand is None
    record = events[-1]
    assert isinstance(record, HandEnded)
    assert (record.how, record.winner, record.points) == ("dead_hand", None, 0)
    assert state.scores == (0, 0)
    assert state.hands_won == (0, 0)
    assert state.last_hand == record
    assert state.needs_deal
    # 29 draws: 2 cards left; the last discard is in the record, the opponent cannot take it
    assert isinstance(events[0], CardDiscarded)
    refuse(state, 0, PILE, "no_hand")
    refuse(state, 1, PILE, "no_hand")
    assert {s.seat: len(s.cards) for s in record.seats} == {0: 10, 1: 10}
    _, started = deal(state, list(range(52)), SALT, 0, T0)
    assert (started[0].dealer, started[0].reason) == (1, "dead_hand_redeal")


def test_r8_1_the_hand_is_not_dead_with_three_left():
    state = play_all(start(list(range(52)), dealer=1), PASS, PASS)
    for _ in range(28):
        state, _ = play(state, STOCK)
        drawn = state.hand.deck[STOCK_START + state.hand.stock_drawn - 1]
        state, events = play(state, c.Discard(card=str(CARDS[drawn])))
    assert state.hand is not None
    assert state.hand.stock_count == 3
    state, events = play(state, STOCK)
    assert events[0].stock_count == 2
    assert state.hand is not None  # dead only at the discard
    drawn = state.hand.deck[STOCK_START + state.hand.stock_drawn - 1]
    state, events = play(state, c.Discard(card=str(CARDS[drawn])))
    assert state.hand is None
    assert events[-1].how == "dead_hand"


def test_r8_2_knock_is_still_allowed_on_the_last_turn():
    # seat 0 (non-dealer) makes the 29th draw; it holds WIN9 and knocks
    state = play_all(start(rigged_deck(WIN9, LOSE10, upcard="Kd"), dealer=1), PASS, PASS)
    for _ in range(28):
        state, _ = play(state, STOCK)
        drawn = state.hand.deck[STOCK_START + state.hand.stock_drawn - 1]
        state, _ = play(state, c.Discard(card=str(CARDS[drawn])))
    state, _ = play(state, STOCK)
    assert state.hand.to_act == 0
    assert state.hand.stock_count == 2
    drawn = str(CARDS[state.hand.deck[STOCK_START + state.hand.stock_drawn - 1]])
    state, events = play(state, knock(card=drawn))
    assert (events[0].how, events[0].winner, events[0].points) == ("knock", 0, 1)
    assert state.scores == (1, 0)


def test_r8_3_stock_low_warns_once_at_four_cards():
    state = play_all(start(list(range(52)), dealer=1), PASS, PASS)
    warnings = []
    while state.hand is not None:
        state, events = play(state, STOCK)
        warnings += [
            (e.stock_count, state.hand.stock_count) for e in events if isinstance(e, StockLow)
        ]
        drawn = state.hand.deck[STOCK_START + state.hand.stock_drawn - 1]
        state, _ = play(state, c.Discard(card=str(CARDS[drawn])))
    assert warnings == [(4, 4)]


def test_r3_1_every_card_is_accounted_for_after_the_deal():
    deck = random.Random(1).sample(range(52), 52)
    state = start(deck)
    hand = state.hand
    stock = hand.deck[STOCK_START:]
    assert hand.hands[0] & hand.hands[1] == 0
    total = hand.hands[0] | hand.hands[1] | mask_of(hand.discard_pile) | mask_of(stock)
    assert total == (1 << 52) - 1
    assert len(stock) == hand.stock_count == 31


def test_r5_2_only_a_seats_commands_are_applied():
    state = start(list(range(52)))
    refuse(state, 1, c.Expire(), "unknown_command")  # the timer's, not a seat's
    for seat in (-1, 2):
        with pytest.raises(IllegalAction) as info:
            apply(state, seat, c.Resign(), T0)
        assert info.value.code == "not_seated"
