"""Table options: docs/RULES.md R9.5, and the knock limits they set (R6.0)."""

from __future__ import annotations

import msgspec
import pytest

from shared.contracts import commands as c
from shared.contracts.events import HandEnded, MatchEnded, MatchStarted
from shared.contracts.options import StrictTableOptions, TableOptions
from shared.engine import Timing, deal, knock_limit, legal, new_game, parse_card
from tests.engine.helpers import (
    PASS,
    SALT,
    STOCK,
    TAKE,
    knock,
    knock_by,
    play,
    play_all,
    play_to_dead_hand,
    refuse,
    rigged_deck,
    start,
)

T0 = Timing(now=0.0)
GIN = "Ac 2c 3c 4d 5d 6d 7h 8h 9h Th"
NO_MELD_96 = "Kc Qd Js Tc 9d 8s Kd Qs Jc 9s"
WIN9 = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s"
LOSE10 = "Jc Jd Js Qc Qd Qs 2s 3s 4s Kh"
KNOCK5 = "Ac 2c 3c 7d 8d 9d Th Jh Qh 5s"
UNDERCUT5 = "4c Kh 5d 8s 9s Ts Js 6c 6h 6s"


def game(**options):
    state, _ = new_game(TableOptions(**options), T0)
    return state


def record_of(events) -> HandEnded:
    return next(e for e in events if isinstance(e, HandEnded))


def test_r9_5_defaults_are_selminhas():
    options = TableOptions()
    assert msgspec.structs.asdict(options) == {
        "target": 100,
        "gin_bonus": 25,
        "big_gin_bonus": 31,
        "big_gin": True,
        "undercut_bonus": 25,
        "box_bonus": 25,
        "game_bonus": 100,
        "shutout_bonus": 200,
        "dealer": "winner",
        "straight_gin": False,
        "oklahoma": False,
        "hollywood": False,
    }
    assert msgspec.json.decode(b"{}", type=TableOptions) == options


def test_r9_5_options_are_shown_when_the_match_starts():
    options = TableOptions(target=50, dealer="alternate")
    state, events = new_game(options, T0)
    assert events == [MatchStarted(match=1, options=options)]
    assert state.options == options


@pytest.mark.parametrize(("target", "over"), [(121, True), (122, False)])
def test_r9_5_target(target, over):
    state, events = knock_by(game(target=target), 0, GIN, NO_MELD_96)  # 121
    assert state.scores == (121, 0)
    assert (state.status == "match_over") is over
    assert any(isinstance(e, MatchEnded) for e in events) is over


def test_r9_5_gin_bonus():
    _, events = knock_by(game(gin_bonus=50), 0, GIN, NO_MELD_96)
    assert (record_of(events).how, record_of(events).points) == ("gin", 50 + 96)


def test_r9_5_big_gin_bonus():
    deck = rigged_deck(GIN, NO_MELD_96, upcard="Jh")
    state = play_all(start(deck, dealer=1, options=TableOptions(big_gin_bonus=40)), TAKE)
    _, events = play(state, c.BigGin())
    assert (record_of(events).how, record_of(events).points) == ("big_gin", 40 + 96)


def test_r9_5_big_gin_off_means_discard_and_go_gin():
    deck = rigged_deck(GIN, NO_MELD_96, upcard="Jh")
    state = play_all(start(deck, dealer=1, options=TableOptions(big_gin=False)), TAKE)
    error = refuse(state, 0, c.BigGin(), "big_gin_off")
    assert error.rule == "R6.3"
    moves = legal(state, 0, T0)
    assert c.BigGin() not in moves
    assert c.Knock(card="7h", deadwood=0) in moves
    _, events = play(state, knock())
    record = record_of(events)
    assert (record.how, record.points) == ("gin", 25 + 96)
    assert record.knock_discard == "7h"  # Jh, worth more, was just taken


def test_r9_5_undercut_bonus():
    _, events = knock_by(game(undercut_bonus=10), 0, KNOCK5, UNDERCUT5)
    record = record_of(events)
    assert (record.how, record.winner, record.points) == ("undercut", 1, 10)


@pytest.mark.parametrize("undercut_bonus", [0, 7])
def test_r9_5_zero_and_odd_bonuses_are_allowed(undercut_bonus):
    _, events = knock_by(game(undercut_bonus=undercut_bonus), 0, KNOCK5, UNDERCUT5)
    assert record_of(events).points == undercut_bonus


def test_r9_5_box_game_and_shutout_bonuses():
    options = {"box_bonus": 5, "game_bonus": 70, "shutout_bonus": 300}
    _, events = knock_by(game(**options), 0, GIN, NO_MELD_96)
    ended = next(e for e in events if isinstance(e, MatchEnded))
    assert (ended.tally[0].game_bonus, ended.tally[0].box_bonus) == (300, 5)
    assert ended.tally[0].total == 121 + 300 + 5
    state, _ = knock_by(game(**options), 1, WIN9, LOSE10)
    _, events = knock_by(state, 0, GIN, NO_MELD_96)
    ended = next(e for e in events if isinstance(e, MatchEnded))
    assert [(t.game_bonus, t.box_bonus, t.total) for t in ended.tally] == [
        (70, 5, 121 + 70 + 5),
        (0, 5, 1 + 5),
    ]


@pytest.mark.parametrize(
    ("rule", "dealer", "reason"),
    [
        ("winner", 1, "won_previous_hand"),
        ("loser", 0, "lost_previous_hand"),
        ("alternate", 0, "alternate"),
    ],
)
def test_r9_5_dealer_option_after_an_undercut(rule, dealer, reason):
    # seat 1 dealt hand 1 (lot); seat 0 knocked and seat 1 undercut it
    state, events = knock_by(game(dealer=rule), 0, KNOCK5, UNDERCUT5, lot=1)
    assert record_of(events).winner == 1
    _, started = deal(state, list(range(52)), SALT, 1, T0)
    assert (started[0].dealer, started[0].reason) == (dealer, reason)


@pytest.mark.parametrize("rule", ["winner", "loser", "alternate"])
def test_r9_5_dealer_option_alternates_over_several_hands(rule):
    state = game(dealer=rule, target=1000)
    dealers = []
    for _ in range(4):  # seat 0 wins every hand
        state, _ = knock_by(state, 0, WIN9, LOSE10)
        dealers.append(state.next_dealer)
    expected = {"winner": [0, 0, 0, 0], "loser": [1, 1, 1, 1], "alternate": [1, 0, 1, 0]}
    assert dealers == expected[rule]


def test_r9_5_straight_gin_only_gin_ends_a_hand():
    options = TableOptions(straight_gin=True)
    deck = rigged_deck(WIN9, LOSE10, upcard="Kd", stock="Ks")
    state, _ = new_game(options, T0)
    state, events = deal(state, deck, SALT, 1, T0)
    assert events[0].knock_limit == 0
    state = play_all(state, PASS, PASS, STOCK)
    refuse(state, 0, knock(card="Ks"), "knock_over_limit")
    assert not [m for m in legal(state, 0, T0) if isinstance(m, c.Knock)]
    gin = start(rigged_deck(GIN, NO_MELD_96, upcard="Kh", stock="Ks"), dealer=1, options=options)
    gin = play_all(gin, PASS, PASS, STOCK)
    assert c.Knock(card="Ks", deadwood=0) in legal(gin, 0, T0)
    _, events = play(gin, knock(card="Ks"))
    assert record_of(events).how == "gin"
    big = start(rigged_deck(GIN, NO_MELD_96, upcard="Jh"), dealer=1, options=options)
    big = play_all(big, TAKE)
    _, events = play(big, c.BigGin())
    assert (record_of(events).how, record_of(events).points) == ("big_gin", 31 + 96)


@pytest.mark.parametrize(
    ("upcard", "limit"),
    [
        ("Ad", 0),
        ("As", 0),
        ("2d", 2),
        ("5h", 5),
        ("9c", 9),
        ("Td", 10),
        ("Jh", 10),
        ("Qh", 10),
        ("Kc", 10),
    ],
)
def test_r9_5_oklahoma_upcard_sets_the_knock_limit(upcard, limit):
    options = TableOptions(oklahoma=True)
    assert knock_limit(options, parse_card(upcard)) == limit
    deck = rigged_deck(WIN9, "Jc Jd Js Qc Qd Qs 2s 3s 4s 6h", upcard=upcard)
    state, _ = new_game(options, T0)
    state, events = deal(state, deck, SALT, 0, T0)
    assert events[0].knock_limit == limit
    assert state.hand.knock_limit == limit


def test_r9_5_oklahoma_limit_is_set_per_hand():
    options = TableOptions(oklahoma=True)
    state, _ = new_game(options, T0)
    state, first = deal(state, rigged_deck(WIN9, LOSE10, upcard="3h"), SALT, 0, T0)
    state, _ = play_to_dead_hand(state)
    _, second = deal(state, rigged_deck(WIN9, LOSE10, upcard="Qh"), SALT, 0, T0)
    assert (first[0].knock_limit, second[0].knock_limit) == (3, 10)


def test_r9_5_oklahoma_knock_within_the_upcards_value():
    options = TableOptions(oklahoma=True)
    seven = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 7s"
    eight = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 8s"
    over = play_all(start(rigged_deck(eight, LOSE10, "7c", "Ks"), 1, options), PASS, PASS, STOCK)
    refuse(over, 0, knock(card="Ks"), "knock_over_limit")
    ok = play_all(start(rigged_deck(seven, LOSE10, "7c", "Ks"), 1, options), PASS, PASS, STOCK)
    assert c.Knock(card="Ks", deadwood=7) in legal(ok, 0, T0)
    _, events = play(ok, knock(card="Ks"))
    assert (record_of(events).how, record_of(events).points) == ("knock", 3)


def test_r9_5_oklahoma_ace_means_gin_only():
    options = TableOptions(oklahoma=True)
    one = "Ac 2c 3c 4d 5d 6d 7h 8h 9h Ah"
    state = play_all(start(rigged_deck(one, LOSE10, "Ad", "Ks"), 1, options), PASS, PASS, STOCK)
    refuse(state, 0, knock(card="Ks"), "knock_over_limit")
    state = play_all(start(rigged_deck(GIN, LOSE10, "Ad", "Ks"), 1, options), PASS, PASS, STOCK)
    _, events = play(state, knock(card="Ks"))
    assert record_of(events).how == "gin"


def test_r9_5_oklahoma_no_doubling_of_spades():
    # a spade upcard (5s) sets the limit to 5 and the hand scores as any other
    options = TableOptions(oklahoma=True)
    knocker = "Ac 2c 3c 7d 8d 9d Th Jh Qh 2h"  # 2
    defender = "Jc Jd Js Qc Qd Qs 2s 3s 4s Kc"  # 10
    state = start(rigged_deck(knocker, defender, "5s", "Ks"), 1, options)
    assert state.hand.knock_limit == 5
    state = play_all(state, PASS, PASS, STOCK)
    state, events = play(state, knock(card="Ks"))
    assert (record_of(events).how, record_of(events).points) == ("knock", 8)
    assert state.scores == (8, 0)
    deck = rigged_deck(GIN, NO_MELD_96, "5s", "Kh")
    state = play_all(start(deck, 1, options), PASS, PASS, STOCK)
    _, events = play(state, knock(card="Kh"))
    assert (record_of(events).how, record_of(events).points) == ("gin", 25 + 96)


# --- bad options are refused -------------------------------------------------------------------

BAD = [
    {"target": 0},
    {"target": -5},
    {"gin_bonus": -1},
    {"big_gin_bonus": -1},
    {"undercut_bonus": -1},
    {"box_bonus": -1},
    {"game_bonus": -1},
    {"shutout_bonus": -1},
    {"dealer": "random"},
    {"straight_gin": True, "oklahoma": True},
]


def option_id(bad: dict) -> str:
    return ",".join(f"{key}={value}" for key, value in bad.items())


@pytest.mark.parametrize("bad", BAD, ids=option_id)
def test_r9_5_bad_options_are_refused_when_decoded(bad):
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(bad), type=TableOptions)


def test_r9_5_unknown_options_are_refused_when_decoded():
    # A request's options are strict; events carry TableOptions, which tolerates new options.
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"doubling": true}', type=StrictTableOptions)
    assert msgspec.json.decode(b'{"doubling": true}', type=TableOptions) == TableOptions()


def test_r9_5_straight_gin_with_oklahoma_is_refused_when_constructed():
    with pytest.raises((ValueError, msgspec.ValidationError), match="straight_gin"):
        TableOptions(straight_gin=True, oklahoma=True)


@pytest.mark.parametrize(
    "bad", [{"target": 0}, {"target": -5}, {"gin_bonus": -1}, {"dealer": "random"}], ids=option_id
)
def test_r9_5_bad_options_are_refused_when_constructed(bad):
    with pytest.raises((ValueError, msgspec.ValidationError)):
        new_game(TableOptions(**bad), T0)


def test_r9_5_good_options_round_trip():
    options = TableOptions(
        target=250,
        gin_bonus=20,
        big_gin_bonus=50,
        big_gin=False,
        undercut_bonus=20,
        box_bonus=20,
        game_bonus=150,
        shutout_bonus=300,
        dealer="loser",
        oklahoma=True,
    )
    assert msgspec.json.decode(msgspec.json.encode(options), type=TableOptions) == options
