"""Who sees what, and what each seat may do: docs/RULES.md section 11 and ``legal``."""

from __future__ import annotations

import random
import re

import msgspec
import pytest

from shared.contracts import commands as c
from shared.contracts.events import HandEnded
from shared.contracts.options import TableOptions
from shared.engine import IllegalAction, Timing, apply, deal, legal, new_game, to_act, view
from shared.engine.cards import CARDS, cards_of
from shared.engine.state import STOCK_START
from tests.engine.helpers import (
    PASS,
    PILE,
    SALT,
    STOCK,
    TAKE,
    after_first_draw,
    play,
    play_all,
    rigged_deck,
    sorted_texts,
    start,
)

T0 = Timing(now=0.0)
CARD_TEXT = re.compile(r'"([A2-9TJQK][cdhs])"')
SEAT0 = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s"
SEAT1 = "Jc Jd Js Qc Qd Qs 2s 3s 4s Kh"


def scripted():
    """Seat 1 deals. Seat 0 takes the upcard 5c and discards 9s; seat 1 takes 9s from the pile
    and discards Kh; seat 0 draws 6s from the stock and discards it."""
    deck = rigged_deck(SEAT0, SEAT1, upcard="5c", stock="6s 7s")
    return play_all(
        start(deck, dealer=1),
        TAKE,
        c.Discard(card="9s"),
        PILE,
        c.Discard(card="Kh"),
        STOCK,
        c.Discard(card="6s"),
    )


def card_texts(struct) -> set[str]:
    return set(CARD_TEXT.findall(msgspec.json.encode(struct).decode()))


# --- R11.1: a player's view -------------------------------------------------------------------


def test_r11_1_a_player_sees_own_hand_pile_counts_known_cards_scores_and_limit():
    state = scripted()
    match, hand = view(state, 0)
    assert hand.my_cards == sorted_texts("Ac 2c 3c 5c 4d 5d 6d 7h 8h 9h")
    assert hand.discard_pile == ["Kh", "6s"]  # bottom first: every card, in order
    assert hand.stock_count == 30
    assert hand.opponent_card_count == 10
    assert hand.card_counts == [10, 10]
    assert hand.opponent_known == ["9s"]  # taken from the pile and still held
    assert hand.known == [["5c"], ["9s"]]
    assert hand.knock_limit == 10
    assert (hand.to_act, hand.phase, hand.dealer) == (1, "draw", 1)
    assert match.scores == [0, 0]
    assert match.hands_won == [0, 0]
    assert match.dealer == 1
    assert hand.my_arrangement.deadwood == ["5c"]
    assert hand.my_arrangement.points == 5
    assert view(state, 1)[1].opponent_known == ["5c"]


def test_r11_1_a_known_card_stops_being_known_once_discarded():
    state = scripted()
    state = play_all(state, STOCK, c.Discard(card="9s"))
    assert view(state, 0)[1].opponent_known == []
    assert view(state, 0)[1].discard_pile == ["Kh", "6s", "9s"]


def test_r11_1_legal_knock_entries_carry_the_deadwood_they_leave():
    # SEAT0 + 2s: discarding 9s leaves 2, discarding 2s leaves 9; nothing else is within 10
    state = after_first_draw(SEAT0, "Jc Jd Js Qc Qd Qs 3s 4s 5s Kh", "2s")
    moves = legal(state, 0, T0)
    knocks = [m for m in moves if isinstance(m, c.Knock)]
    assert knocks == [c.Knock(card="2s", deadwood=9), c.Knock(card="9s", deadwood=2)]
    discards = [m.card for m in moves if isinstance(m, c.Discard)]
    assert discards == sorted_texts(SEAT0 + " 2s")
    assert moves[-2:] == [c.Resign(), c.Leave()]
    assert c.BigGin() not in moves
    assert view(state, 0)[1].my_arrangement.points == 2
    assert view(state, 0)[1].my_arrangement.discard == "9s"


def test_r11_1_legal_shows_gin_and_big_gin():
    deck = rigged_deck("Ac 2c 3c 4d 5d 6d 7h 8h 9h Th", SEAT1.replace("Kh", "Ks"), upcard="Jh")
    state = play_all(start(deck, dealer=1), TAKE)
    moves = legal(state, 0, T0)
    assert c.BigGin() in moves
    knocks = {m.card: m.deadwood for m in moves if isinstance(m, c.Knock)}
    assert knocks["7h"] == 0  # gin
    assert "Jh" not in knocks  # just taken
    assert knocks["Ac"] == 2 + 3  # Ac out: 2c 3c are deadwood
    assert all(d <= 10 for d in knocks.values())


def test_r11_1_legal_at_each_decision():
    state = start(list(range(52)), dealer=1)
    assert legal(state, 0, T0) == [c.TakeUpcard(), c.PassUpcard(), c.Resign(), c.Leave()]
    assert legal(state, 1, T0) == [c.Resign(), c.Leave()]
    state = play_all(state, PASS)
    assert legal(state, 1, T0) == [c.TakeUpcard(), c.PassUpcard(), c.Resign(), c.Leave()]
    state = play_all(state, PASS)
    assert legal(state, 0, T0) == [c.Draw(source="stock"), c.Resign(), c.Leave()]
    state = play_all(state, STOCK, c.Discard(card=str(CARDS[state.hand.deck[STOCK_START]])))
    assert legal(state, 1, T0) == [
        c.Draw(source="stock"),
        c.Draw(source="discard"),
        c.Resign(),
        c.Leave(),
    ]


# --- R11.2: a spectator's view ------------------------------------------------------------------


def test_r11_2_a_spectator_sees_the_public_part_with_both_seats_known_cards():
    state = scripted()
    match, hand = view(state, None)
    assert hand.my_cards is None
    assert hand.my_arrangement is None
    assert hand.opponent_card_count is None
    assert hand.opponent_known is None
    assert hand.known == [["5c"], ["9s"]]
    assert hand.card_counts == [10, 10]
    assert hand.discard_pile == ["Kh", "6s"]
    assert hand.stock_count == 30
    assert hand.knock_limit == 10
    assert match.scores == [0, 0]
    assert card_texts(hand) == {"5c", "9s", "Kh", "6s"}
    assert legal(state, None, T0) == []
    assert legal(state, 2, T0) == []
    with pytest.raises(IllegalAction) as info:
        apply(state, 2, c.Resign(), T0)
    assert info.value.code == "not_seated"


# --- R11.3: nobody sees hidden cards ------------------------------------------------------------


def test_r11_3_views_hold_no_hidden_card():
    state = scripted()
    hand = state.hand
    own = [set(sorted_texts(" ".join(str(x) for x in cards_of(hand.hands[s])))) for s in (0, 1)]
    public = {"5c", "9s", "Kh", "6s"}
    for seat in (0, 1):
        match, seen = view(state, seat)
        assert card_texts(seen) <= own[seat] | public
        assert card_texts(match) == set()
        hidden = own[1 - seat] - public
        assert not card_texts(seen) & hidden
    stock = {str(CARDS[x]) for x in hand.deck[STOCK_START + hand.stock_drawn :]}
    for seat in (0, 1, None):
        assert not card_texts(view(state, seat)) & stock


def test_r11_3_stock_draws_are_not_announced_pile_draws_are():
    deck = rigged_deck(SEAT0, SEAT1, upcard="5c", stock="6s 7s")
    state = play_all(start(deck, dealer=1), PASS, PASS)
    state, events = play(state, STOCK)
    assert card_texts(events) == set()
    state, events = play(state, c.Discard(card="6s"))
    state, events = play(state, PILE)
    assert card_texts(events) == {"6s"}


def _public(state) -> set[str]:
    hand = state.hand
    known = hand.known[0] | hand.known[1]
    return {str(x) for x in cards_of(known)} | {str(CARDS[x]) for x in hand.discard_pile}


def random_play(seed: int, steps: int = 400):
    """States of a seeded match between two players choosing among ``legal``: mostly the
    discard the SOBRA counter suggests, sometimes any move, knocking now and then."""
    rng = random.Random(seed)
    state, _ = new_game(TableOptions(target=60), T0)
    for _ in range(steps):
        if state.status != "playing":
            return
        if state.needs_deal:
            state, _ = deal(state, rng.sample(range(52), 52), SALT, rng.randrange(2), T0)
        yield state
        seat = to_act(state)
        playable = [m for m in legal(state, seat, T0) if not isinstance(m, c.Resign | c.Leave)]
        knocks = [m for m in playable if isinstance(m, c.Knock | c.BigGin)]
        move = rng.choice(knocks) if knocks and rng.random() < 0.15 else rng.choice(playable)
        if state.hand.phase == "discard" and not isinstance(move, c.Knock) and rng.random() < 0.8:
            move = c.Discard(card=view(state, seat)[1].my_arrangement.discard)  # play well
        state, events = apply(state, seat, move, T0)
        for event in events:
            if isinstance(event, HandEnded):  # R11.3: both hands shown at the end
                assert {s.seat for s in event.seats} == {0, 1}
                assert all(len(s.cards) in (10, 11) for s in event.seats)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_r11_4_random_play_views_never_leak_and_legal_is_always_accepted(seed):
    """At every step each view shows only what its viewer may know, every command in
    ``legal`` is accepted (so a bot or a person picking from it is never refused), and a
    discard not in ``legal`` is refused."""
    steps = 0
    for state in random_play(seed):
        hand = state.hand
        public = _public(state)
        for seat in (0, 1):
            own = {str(x) for x in cards_of(hand.hands[seat])}
            match, seen = view(state, seat)
            assert card_texts(seen) <= own | public
            assert set(seen.my_cards) == own
            assert card_texts(msgspec.structs.replace(match, last_hand=None)) == set()
        assert card_texts(view(state, None)[1]) <= public
        seat = to_act(state)
        moves = legal(state, seat, T0)
        for move in moves:
            apply(state, seat, move, T0)
        for move in legal(state, 1 - seat, T0):
            apply(state, 1 - seat, move, T0)
        if hand.phase == "discard":
            allowed = {m.card for m in moves if isinstance(m, c.Discard)}
            for card in cards_of(hand.hands[seat]):
                if str(card) not in allowed:
                    with pytest.raises(IllegalAction):
                        apply(state, seat, c.Discard(card=str(card)), T0)
        steps += 1
    assert steps > 50


@pytest.mark.parametrize("seed", [4, 5])
def test_r2_5_sobra_and_bater_always_agree_in_random_play(seed):
    """With 11 cards the SOBRA counter is the lowest deadwood a knock can leave, its discard
    is the knock the server would make, and BATER (a knock entry) shows exactly then."""
    checked = 0
    for state in random_play(seed):
        hand = state.hand
        seat = to_act(state)
        if hand.phase != "discard":
            continue
        shown = view(state, seat)[1].my_arrangement
        knocks = {m.card: m.deadwood for m in legal(state, seat, T0) if isinstance(m, c.Knock)}
        if shown.points <= hand.knock_limit:
            assert knocks[shown.discard] == shown.points
            assert min(knocks.values()) == shown.points
            _, events = apply(state, seat, c.Knock(), T0)
            record = next(e for e in events if isinstance(e, HandEnded))
            assert record.knock_discard == shown.discard
            assert record.seats[seat].points == shown.points
            assert record.seats[seat].melds == shown.melds
        else:
            assert knocks == {}
        checked += 1
    assert checked > 20
