"""Hollywood gin (table option ``hollywood``): docs/RULES.md R9.6 to R9.12."""

from __future__ import annotations

import random

import msgspec
import pytest

from shared.contracts import commands as c
from shared.contracts.events import GameColumn, HandEnded, MatchEnded, SeatTally
from shared.contracts.options import TableOptions
from shared.engine import (
    GameState,
    Timing,
    apply,
    deal,
    legal,
    my_arrangement,
    new_game,
    to_act,
    view,
)
from tests.engine.helpers import knock_by, play_to_dead_hand, rigged_deck

T0 = Timing(now=0.0)
GIN = "Ac 2c 3c 4d 5d 6d 7h 8h 9h Th"
NO_MELD_96 = "Kc Qd Js Tc 9d 8s Kd Qs Jc 9s"  # gin against it scores 25 + 96 = 121
WIN9 = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s"  # 9 points
LOSE10 = "Jc Jd Js Qc Qd Qs 2s 3s 4s Kh"  # 10 points: WIN9 knocking against it scores 1
KNOCK5 = "Ac 2c 3c 7d 8d 9d Th Jh Qh 5s"  # 5 points
UNDERCUT5 = "4c Kh 5d 8s 9s Ts Js 6c 6h 6s"  # lays off 4c and Kh: 5 left, an undercut (25)


def game(**options: object) -> GameState:
    state, _ = new_game(TableOptions(hollywood=True, **options), T0)  # type: ignore[arg-type]
    return state


def record_of(events: list[object]) -> HandEnded:
    (record,) = [e for e in events if isinstance(e, HandEnded)]
    return record


def ended_of(events: list[object]) -> MatchEnded:
    (ended,) = [e for e in events if isinstance(e, MatchEnded)]
    return ended


def scores(state: GameState) -> list[tuple[int, int]]:
    return [g.scores for g in state.games]


def ones(state: GameState, seat: int, times: int) -> GameState:
    """``seat`` wins ``times`` hands of 1 point each (WIN9 knocking against LOSE10)."""
    for _ in range(times):
        state, events = knock_by(state, seat, WIN9, LOSE10)
        assert record_of(events).points == 1
    return state


# --- R9.6: the option -----------------------------------------------------------------------


def test_r9_6_hollywood_is_off_by_default_and_a_plain_table_has_no_games():
    assert TableOptions().hollywood is False
    state, _ = new_game(TableOptions(), T0)
    assert state.games == ()
    state, events = knock_by(state, 0, WIN9, LOSE10)
    record = record_of(events)
    assert record.games is None
    assert record.scored_in is None
    match, _ = view(state, 0)
    assert match.games is None
    assert "games" not in msgspec.json.decode(msgspec.json.encode(match))  # omitted, not null


@pytest.mark.parametrize(
    "others",
    [
        {"oklahoma": True},
        {"straight_gin": True},
        {"big_gin": False},
        {"dealer": "loser"},
        {"dealer": "alternate"},
        {"target": 250, "game_bonus": 50, "shutout_bonus": 0, "box_bonus": 10},
    ],
    ids=str,
)
def test_r9_6_every_other_option_combines_with_hollywood(others):
    options = TableOptions(hollywood=True, **others)
    assert msgspec.json.decode(msgspec.json.encode(options), type=TableOptions) == options
    state, _ = new_game(options, T0)
    assert len(state.games) == 3


def test_r9_6_straight_gin_with_oklahoma_stays_refused_with_hollywood():
    with pytest.raises(ValueError, match="straight_gin"):
        TableOptions(hollywood=True, straight_gin=True, oklahoma=True)


def test_r9_6_a_stored_state_from_before_hollywood_still_reads():
    """State and events stored before the option existed decode with no games (R9.6)."""
    state, _ = knock_by(new_game(TableOptions(), T0)[0], 0, WIN9, LOSE10)
    old = msgspec.json.decode(msgspec.json.encode(state))
    del old["games"]
    del old["options"]["hollywood"]
    del old["last_hand"]["games"], old["last_hand"]["scored_in"]
    back = msgspec.json.decode(msgspec.json.encode(old), type=GameState)
    assert back == state


# --- R9.7, R9.8: which games a won hand goes into, and boxes -------------------------------


def test_r9_7_first_win_in_game_1_second_in_1_and_2_third_and_later_in_all_three():
    state = game()
    seen = []
    for _ in range(4):
        state, events = knock_by(state, 0, WIN9, LOSE10)
        seen.append(record_of(events).scored_in)
    assert seen == [[1], [1, 2], [1, 2, 3], [1, 2, 3]]
    assert scores(state) == [(4, 0), (3, 0), (2, 0)]
    assert state.scores == (9, 0)  # the three games added up
    assert state.hands_won == (4, 0)


def test_r9_7_the_count_is_per_player():
    state = ones(game(), 0, 2)
    state, events = knock_by(state, 1, WIN9, LOSE10)  # seat 1's first win: game 1 only
    assert record_of(events).scored_in == [1]
    assert scores(state) == [(2, 1), (1, 0), (0, 0)]


def test_r9_7_an_undercut_counts_as_a_won_hand_for_the_defender():
    state = ones(game(), 1, 1)
    state, events = knock_by(state, 0, KNOCK5, UNDERCUT5)
    record = record_of(events)
    assert (record.how, record.winner, record.points) == ("undercut", 1, 25)
    assert record.scored_in == [1, 2]  # the defender's second win
    assert scores(state) == [(0, 26), (0, 25), (0, 0)]


def test_r9_7_points_for_a_closed_game_are_not_scored():
    state, events = knock_by(game(), 0, GIN, NO_MELD_96)  # 121: game 1 closes at once
    assert state.games[0].closed
    state, events = knock_by(state, 1, WIN9, LOSE10)  # seat 1's first win: game 1 only
    record = record_of(events)
    assert record.winner == 1
    assert record.points == 1
    assert record.scored_in == []  # lost: game 1 had closed
    assert scores(state) == [(121, 0), (0, 0), (0, 0)]
    assert state.hands_won == (1, 1)  # it still counts as seat 1's first win
    state, events = knock_by(state, 1, WIN9, LOSE10)  # the second: game 2 is open
    assert record_of(events).scored_in == [2]
    assert scores(state) == [(121, 0), (0, 1), (0, 0)]


def test_r9_8_a_box_for_each_hand_in_each_game_it_went_into():
    state = ones(ones(game(), 0, 3), 1, 1)
    assert [g.boxes for g in state.games] == [(3, 1), (2, 0), (1, 0)]
    record = state.last_hand
    assert record is not None
    assert record.games is not None
    assert [col.boxes for col in record.games] == [[3, 1], [2, 0], [1, 0]]


def test_r9_7_a_dead_hand_scores_nowhere_and_the_same_player_deals():
    state = ones(game(), 0, 1)
    dealer = state.next_dealer
    state, events = play_to_dead_hand(deal_next(state))
    record = record_of(events)
    assert record.how == "dead_hand"
    assert record.scored_in == []
    assert scores(state) == [(1, 0), (0, 0), (0, 0)]
    assert state.next_dealer == dealer  # R3.3


def deal_next(state: GameState) -> GameState:
    deck = rigged_deck(LOSE10, WIN9, "Kd")
    state, _ = deal(state, deck, "salt", 0, T0)
    return state


# --- R9.9, R9.10: a game closes; hands go on until all three have ------------------------------


def test_r9_9_a_game_closes_at_the_target_with_its_own_bonuses():
    state = ones(game(target=3), 1, 1)  # seat 1 has a point in game 1
    state = ones(state, 0, 3)  # seat 0 reaches 3 in game 1 only
    assert [g.winner for g in state.games] == [0, None, None]
    assert state.status == "playing"  # R9.10
    match, _ = view(state, 0)
    assert match.games is not None
    first, second, _ = match.games
    assert (first.closed, first.winner) == (True, 0)
    assert first.tally == [
        SeatTally(points=3, hands_won=3, game_bonus=100, box_bonus=75, total=178),
        SeatTally(points=1, hands_won=1, game_bonus=0, box_bonus=25, total=26),
    ]
    assert (second.closed, second.winner, second.tally) == (False, None, None)


def test_r9_9_shutout_bonus_when_the_loser_scored_nothing_in_that_game():
    state, _ = knock_by(game(), 0, GIN, NO_MELD_96)
    match, _ = view(state, 0)
    assert match.games is not None
    assert match.games[0].tally is not None
    assert match.games[0].tally[0].game_bonus == 200


def test_r9_10_hands_go_on_until_the_third_game_closes():
    state = game(target=2)
    state = ones(state, 0, 2)  # games: (2, 1, 0)
    assert [g.closed for g in state.games] == [True, False, False]
    state = ones(state, 0, 1)  # third win: games 2 and 3, game 1 is closed
    assert scores(state) == [(2, 0), (2, 0), (1, 0)]
    assert state.status == "playing"
    state, events = knock_by(state, 0, WIN9, LOSE10)
    assert state.status == "match_over"
    assert scores(state) == [(2, 0), (2, 0), (2, 0)]
    assert ended_of(events).reason == "target"


def test_r9_10_one_hand_can_close_several_games():
    state = ones(game(), 0, 2)
    state, events = knock_by(state, 0, GIN, NO_MELD_96)  # 121 into all three
    assert state.status == "match_over"
    assert record_of(events).scored_in == [1, 2, 3]


@pytest.mark.parametrize(
    ("rule", "dealer_after"), [("winner", 1), ("loser", 0), ("alternate", None)]
)
def test_r9_10_the_dealer_rule_is_unchanged_also_after_a_hand_that_scored_nowhere(
    rule, dealer_after
):
    state, _ = knock_by(game(dealer=rule), 0, GIN, NO_MELD_96)  # game 1 closes
    dealer = state.next_dealer  # who deals the next hand
    assert dealer is not None
    state, events = knock_by(state, 1, WIN9, LOSE10)  # goes into no open game
    assert record_of(events).scored_in == []
    if dealer_after is None:  # alternate: the other player than that hand's dealer
        assert (state.next_dealer, state.next_reason) == (1 - dealer, "alternate")
    else:
        assert state.next_dealer == dealer_after


# --- R9.11, R9.12: the end of the match --------------------------------------------------------


def test_r9_11_the_winner_won_two_games_whatever_the_tally():
    # seat 1 wins game 1 with a big hand; seat 0 then wins games 2 and 3 with small ones
    state, _ = knock_by(
        game(target=3, game_bonus=0, shutout_bonus=0, box_bonus=0), 1, GIN, NO_MELD_96
    )
    state = ones(state, 0, 5)
    assert [g.winner for g in state.games] == [1, 0, 0]
    assert state.status == "match_over"
    result = state.result
    assert result is not None
    assert result.winner == 0
    assert result.tally[1].total > result.tally[0].total  # 121 against 6
    assert result.games is not None
    assert [col.winner for col in result.games] == [1, 0, 0]
    for seat in (0, 1):
        for field in ("points", "hands_won", "game_bonus", "box_bonus", "total"):
            column_sum = sum(getattr(col.tally[seat], field) for col in result.games)  # type: ignore[index]
            assert getattr(result.tally[seat], field) == column_sum


def test_r9_11_views_carry_the_three_columns():
    state = ones(game(), 0, 2)
    match, _ = view(state, None)
    assert match.games == [
        GameColumn(game=1, scores=[2, 0], boxes=[2, 0]),
        GameColumn(game=2, scores=[1, 0], boxes=[1, 0]),
        GameColumn(game=3, scores=[0, 0], boxes=[0, 0]),
    ]
    assert match.scores == [3, 0]


def test_r9_12_early_end_closed_games_keep_their_bonuses_open_ones_get_none():
    state, _ = knock_by(game(), 0, GIN, NO_MELD_96)  # game 1: 121 - 0, shutout
    state = ones(state, 1, 2)  # seat 1: nothing in game 1 (closed), 1 in game 2
    state = deal_next(state)
    state, events = apply(state, 0, c.Resign(), T0)
    ended = ended_of(events)
    assert (ended.winner, ended.reason) == (1, "resigned")
    assert ended.games is not None
    assert ended.games[0].tally is not None
    assert ended.games[0].tally[0].game_bonus == 200
    assert ended.games[1].tally is not None
    assert [t.game_bonus for t in ended.games[1].tally] == [0, 0]
    assert ended.tally[0].total == 121 + 200 + 25
    assert ended.tally[1].total == 1  # game 2 is open: not even its box bonus


def test_r9_12_a_rematch_starts_three_empty_games():
    state = ones(game(target=1), 0, 3)
    assert state.status == "match_over"
    state, _ = apply(state, 0, c.Rematch(), T0)
    state, _ = apply(state, 1, c.Rematch(), T0)
    assert state.match == 2
    assert scores(state) == [(0, 0), (0, 0), (0, 0)]
    assert state.hands_won == (0, 0)


# --- a whole match, played to its end ---------------------------------------------------------


class Sheet:
    """An independent score sheet of a Hollywood match, kept from the hand records alone."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.points = [[0, 0] for _ in range(3)]
        self.boxes = [[0, 0] for _ in range(3)]
        self.winner: list[int | None] = [None, None, None]
        self.wins = [0, 0]

    def add(self, record: HandEnded) -> list[int]:
        if record.winner is None:
            return []
        seat = record.winner
        self.wins[seat] += 1
        went = []
        for game in range(min(self.wins[seat], 3)):
            if self.winner[game] is None:
                self.points[game][seat] += record.points
                self.boxes[game][seat] += 1
                went.append(game + 1)
                if self.points[game][seat] >= self.target:
                    self.winner[game] = seat
        return went


@pytest.mark.parametrize(
    "options",
    [
        TableOptions(hollywood=True),
        TableOptions(hollywood=True, target=60, dealer="alternate"),
        TableOptions(hollywood=True, target=40, oklahoma=True, dealer="loser"),
    ],
    ids=["default", "alternate", "oklahoma"],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_r9_11_a_whole_hollywood_match_played_to_its_end(options, seed):
    """R9.6 to R9.11: random players; every record checked against an independent sheet."""
    rng = random.Random(seed)
    state, _ = new_game(options, T0)
    sheet = Sheet(options.target)
    hands = 0
    for _ in range(50_000):
        if state.status != "playing":
            break
        if state.needs_deal:
            deck = list(range(52))
            rng.shuffle(deck)
            state, _ = deal(state, deck, f"salt{hands}", rng.randrange(2), T0)
            hands += 1
            continue
        seat = to_act(state)
        assert seat is not None
        moves = [m for m in legal(state, seat, T0) if not isinstance(m, c.Resign | c.Leave)]
        knocks = [m for m in moves if isinstance(m, c.Knock | c.BigGin)]
        hand = state.hand
        assert hand is not None
        if knocks and rng.random() < 0.8:
            command = rng.choice(knocks)
        elif hand.phase == "discard" and rng.random() < 0.8:  # the discard SOBRA suggests
            command = c.Discard(card=str(my_arrangement(hand, seat).discard))
        else:
            command = rng.choice([m for m in moves if not isinstance(m, c.Knock | c.BigGin)])
        state, events = apply(state, seat, command, T0)
        for event in events:
            if isinstance(event, HandEnded):
                assert event.scored_in == sheet.add(event)
                assert event.games is not None
                assert [col.scores for col in event.games] == sheet.points
                assert [col.boxes for col in event.games] == sheet.boxes
                assert [col.winner for col in event.games] == sheet.winner
                assert event.hands_won == sheet.wins
                assert event.scores == [sum(p[s] for p in sheet.points) for s in (0, 1)]
    assert state.status == "match_over", "the match did not end"
    result = state.result
    assert result is not None
    assert result.reason == "target"
    assert None not in sheet.winner  # all three games closed (R9.10)
    assert result.winner is not None
    assert sheet.winner.count(result.winner) >= 2  # R9.11
    assert result.games is not None
    assert len(result.games) == 3
    for seat in (0, 1):
        points = sum(p[seat] for p in sheet.points)
        boxes = sum(b[seat] for b in sheet.boxes)
        won = sheet.winner.count(seat)
        tally = result.tally[seat]
        assert (tally.points, tally.hands_won) == (points, boxes)
        assert tally.box_bonus == boxes * options.box_bonus
        assert won * options.game_bonus <= tally.game_bonus <= won * options.shutout_bonus
        assert tally.total == points + tally.game_bonus + tally.box_bonus
