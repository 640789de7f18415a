"""Scoring a hand and the match: docs/RULES.md R7.5 to R7.9, section 9, and R10.2 / R10.3 timing."""

from __future__ import annotations

import pytest

from shared.contracts import commands as c
from shared.contracts.events import (
    HandEnded,
    MatchEnded,
    MatchStarted,
    RematchAccepted,
    RematchOffered,
    SeatTally,
    TableClosed,
    TableExpired,
)
from shared.contracts.options import TableOptions
from shared.engine import IllegalAction, Timing, apply, deal, expire, legal, new_game, view
from shared.engine.cards import CARDS
from tests.engine.helpers import (
    PASS,
    SALT,
    STOCK,
    TAKE,
    knock_by,
    play,
    play_all,
    play_to_dead_hand,
    refuse,
    rigged_deck,
    sorted_texts,
    start,
)

T0 = Timing(now=0.0)
HOUR = 3600.0
DAY = 24 * HOUR

GIN = "Ac 2c 3c 4d 5d 6d 7h 8h 9h Th"
NO_MELD_96 = "Kc Qd Js Tc 9d 8s Kd Qs Jc 9s"  # no meld: 96 points
WIN9 = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s"  # 9 points
LOSE10 = "Jc Jd Js Qc Qd Qs 2s 3s 4s Kh"  # 10 points, nothing to lay off on WIN9
KNOCK5 = "Ac 2c 3c 7d 8d 9d Th Jh Qh 5s"  # 5 points
UNDERCUT5 = "4c Kh 5d 8s 9s Ts Js 6c 6h 6s"  # lays off 4c and Kh: 5 left
UNDERCUT2 = "4c Kh 2d 8s 9s Ts Js 6c 6h 6s"  # lays off 4c and Kh: 2 left
ALL_MELDED = "Kc Kd Ks Qc Qd Qs 2s 3s 4s 5s"


def game(**options) -> object:
    state, _ = new_game(TableOptions(**options), T0)
    return state


def hand_ended(events) -> HandEnded:
    (record,) = [e for e in events if isinstance(e, HandEnded)]
    return record


def match_ended(events) -> MatchEnded:
    (ended,) = [e for e in events if isinstance(e, MatchEnded)]
    return ended


# --- R7.5 to R7.9: one hand's score -------------------------------------------------------


def test_r7_5_knocker_strictly_lower_scores_the_difference():
    state, events = knock_by(game(), 0, WIN9, LOSE10)
    record = hand_ended(events)
    assert (record.how, record.winner, record.points) == ("knock", 0, 1)
    assert [s.points for s in record.seats] == [9, 10]
    assert state.scores == (1, 0)


def test_r7_6_trap_tie_after_layoffs_is_an_undercut():
    # the defender's 4c and Kh go on the knocker's runs: 5 against 5
    state, events = knock_by(game(), 0, KNOCK5, UNDERCUT5)
    record = hand_ended(events)
    assert sorted(x.card for x in record.layoffs) == ["4c", "Kh"]
    assert [s.points for s in record.seats] == [5, 5]
    assert (record.how, record.winner, record.points) == ("undercut", 1, 25)
    assert state.scores == (0, 25)


def test_r7_6_undercut_scores_the_difference_plus_the_bonus():
    state, events = knock_by(game(), 0, KNOCK5, UNDERCUT2)
    record = hand_ended(events)
    assert (record.how, record.winner, record.points) == ("undercut", 1, 5 - 2 + 25)
    assert state.scores == (0, 28)


def test_r7_6_gin_is_never_undercut():
    _, events = knock_by(game(), 0, GIN, ALL_MELDED)
    record = hand_ended(events)
    assert record.seats[1].points == 0
    assert (record.how, record.winner, record.points) == ("gin", 0, 25)


def test_r7_6_big_gin_is_never_undercut():
    deck = rigged_deck(GIN, ALL_MELDED, upcard="Jh")
    state = play_all(start(deck, dealer=1), TAKE)
    _, events = play(state, c.BigGin())
    record = hand_ended(events)
    assert (record.how, record.winner, record.points) == ("big_gin", 0, 31)


def test_r7_7_gin_scores_bonus_plus_defenders_whole_deadwood_without_layoffs():
    # the defender's 4c 3d Jh would lay off on a knock; against gin they count
    defender = "4c 3d Jh Kc Kd Kh 5s 6s 7s 9c"
    state, events = knock_by(game(), 0, GIN, defender)
    record = hand_ended(events)
    assert record.how == "gin"
    assert record.layoffs == []
    assert record.seats[1].melds == [["Kc", "Kd", "Kh"], ["5s", "6s", "7s"]]
    assert record.points == 25 + 4 + 3 + 10 + 9
    assert state.scores == (51, 0)


def test_r7_8_big_gin_scores_31_plus_defenders_whole_deadwood():
    defender = "4c 3d Qs Kc Kd Kh 5s 6s 7s 9c"
    deck = rigged_deck(GIN, defender, upcard="Jh")
    state = play_all(start(deck, dealer=1), TAKE)
    state, events = play(state, c.BigGin())
    record = hand_ended(events)
    assert record.how == "big_gin"
    assert record.layoffs == []
    assert record.points == 31 + 4 + 3 + 10 + 9
    assert state.scores == (57, 0)


@pytest.mark.parametrize(
    ("knocker", "defender", "how", "winner"),
    [
        (WIN9, LOSE10, "knock", 0),
        (KNOCK5, UNDERCUT5, "undercut", 1),
        (GIN, NO_MELD_96, "gin", 0),
    ],
)
def test_r7_9_the_winner_of_a_hand(knocker, defender, how, winner):
    state, events = knock_by(game(target=500), 0, knocker, defender)
    record = hand_ended(events)
    assert (record.how, record.winner, record.knocker) == (how, winner, 0)
    assert state.hands_won == ((1, 0) if winner == 0 else (0, 1))
    assert record.hands_won == list(state.hands_won)
    assert record.scores == list(state.scores)


def test_r7_9_a_dead_hand_has_no_winner():
    state, events = play_to_dead_hand(start(list(range(52))))
    record = hand_ended(events)
    assert (record.how, record.winner) == ("dead_hand", None)
    assert state.hands_won == (0, 0)


# --- R9.1 and R9.2: the target and the final tally -----------------------------------------


def test_r9_1_match_to_100_by_default():
    state = game()
    assert state.options.target == 100
    state, events = knock_by(state, 0, WIN9, LOSE10)  # 1 point: play on
    assert state.status == "playing"
    assert state.needs_deal
    assert not any(isinstance(e, MatchEnded) for e in events)
    assert view(state, 1)[0].last_hand == hand_ended(events)  # the record stays available
    state, events = knock_by(state, 0, GIN, NO_MELD_96)  # 121: over
    assert state.scores == (1 + 121, 0)
    assert state.status == "match_over"
    assert not state.needs_deal
    assert [type(e) for e in events] == [HandEnded, MatchEnded]
    ended = match_ended(events)
    assert (ended.winner, ended.reason, ended.by) == (0, "target", None)
    assert state.result == ended
    assert view(state, 1)[0].result == ended


def test_r9_1_reaching_exactly_the_target_wins():
    state, events = knock_by(game(target=1), 1, WIN9, LOSE10)
    assert state.scores == (0, 1)
    assert match_ended(events).winner == 1


def test_r9_1_below_the_target_plays_on():
    state, _ = knock_by(game(target=2), 1, WIN9, LOSE10)
    assert state.status == "playing"
    assert state.needs_deal


def test_r9_2_game_bonus_and_box_bonus_for_both_players():
    state, _ = knock_by(game(), 1, WIN9, LOSE10)  # seat 1: 1 point, one hand
    state, events = knock_by(state, 0, GIN, NO_MELD_96)  # seat 0: 121, one hand
    ended = match_ended(events)
    assert ended.winner == 0
    assert ended.tally == [
        SeatTally(points=121, hands_won=1, game_bonus=100, box_bonus=25, total=246),
        SeatTally(points=1, hands_won=1, game_bonus=0, box_bonus=25, total=26),
    ]


def test_r9_2_shutout_doubles_the_game_bonus():
    state, events = knock_by(game(), 0, GIN, NO_MELD_96)
    ended = match_ended(events)
    assert ended.tally == [
        SeatTally(points=121, hands_won=1, game_bonus=200, box_bonus=25, total=346),
        SeatTally(points=0, hands_won=0, game_bonus=0, box_bonus=0, total=0),
    ]
    assert state.result.tally == ended.tally


def test_r9_2_the_winner_is_who_reached_the_target_whatever_the_tally():
    state = game(target=26, box_bonus=100, game_bonus=0)
    state, _ = knock_by(state, 0, WIN9, LOSE10)
    state, _ = knock_by(state, 0, WIN9, LOSE10)
    assert state.scores == (2, 0)
    # seat 1 goes gin against 1 point of deadwood: 26
    state, events = knock_by(
        state, 1, "2c 3c 4c 4d 5d 6d 7h 8h 9h Th", "Jc Jd Js Qc Qd Qs 2s 3s 4s Ah"
    )
    ended = match_ended(events)
    assert ended.winner == 1
    assert [t.total for t in ended.tally] == [2 + 200, 26 + 100]
    assert ended.tally[0].total > ended.tally[1].total


# --- R9.3: resigning, leaving ----------------------------------------------------------------


@pytest.mark.parametrize(("command", "reason"), [(c.Resign(), "resigned"), (c.Leave(), "left")])
@pytest.mark.parametrize("quitter", [0, 1])
def test_r9_3_resign_or_leave_at_any_moment_reveals_the_hand(command, reason, quitter):
    # seat 1 is to act (upcard): seat 0 quits on the opponent's turn, seat 1 on its own
    deck = rigged_deck(GIN, NO_MELD_96, upcard="Qh")
    state = start(deck, dealer=0)
    assert state.hand.to_act == 1
    assert command in legal(state, quitter, T0)
    state, events = apply(state, quitter, command, Timing(now=5.0))
    record = hand_ended(events)
    assert (record.how, record.winner) == ("abandoned", None)
    assert {s.seat: s.cards for s in record.seats} == {
        1: sorted_texts(GIN),
        0: sorted_texts(NO_MELD_96),
    }
    assert record.deck == [str(CARDS[x]) for x in deck]
    assert record.salt == SALT
    ended = match_ended(events)
    assert (ended.winner, ended.reason, ended.by) == (1 - quitter, reason, quitter)
    assert state.status == "match_over"
    assert state.hand is None
    assert state.last_move_at == 5.0


def test_r9_3_resign_in_the_middle_of_a_turn():
    deck = rigged_deck(GIN, NO_MELD_96, upcard="Qh", stock="2h")
    state = play_all(start(deck, dealer=1), PASS, PASS, STOCK)
    state, events = apply(state, 0, c.Resign(), T0)
    record = hand_ended(events)
    assert sorted_texts(GIN + " 2h") == {s.seat: s.cards for s in record.seats}[0]
    assert match_ended(events).winner == 1


def test_r9_3_no_bonuses_when_a_match_ends_early():
    state, _ = knock_by(game(), 0, WIN9, LOSE10)
    state, events = apply(state, 0, c.Resign(), T0)  # between hands: nothing to reveal
    assert not any(isinstance(e, HandEnded) for e in events)
    ended = match_ended(events)
    assert (ended.winner, ended.reason, ended.by) == (1, "resigned", 0)
    assert ended.tally == [
        SeatTally(points=1, hands_won=1, game_bonus=0, box_bonus=0, total=1),
        SeatTally(points=0, hands_won=0, game_bonus=0, box_bonus=0, total=0),
    ]


def test_r9_3_no_resigning_once_the_match_is_over():
    state, _ = knock_by(game(target=1), 0, WIN9, LOSE10)
    refuse(state, 0, c.Resign(), "match_over")
    refuse(state, 1, c.ClaimAbsence(), "match_over")
    refuse(state, 1, c.TakeUpcard(), "match_over")


# --- R9.4: rematch ---------------------------------------------------------------------------


def finished():
    state, _ = knock_by(game(target=1, gin_bonus=40), 0, WIN9, LOSE10)
    assert state.status == "match_over"
    return state


@pytest.mark.parametrize("lot", [0, 1])
def test_r9_4_rematch_when_both_agree(lot):
    state = finished()
    state, events = apply(state, 1, c.Rematch(), T0)
    assert events == [RematchOffered(match=1, seat=1)]
    assert state.status == "match_over"
    assert view(state, 0)[0].rematch_offers == [1]
    assert c.Rematch() in legal(state, 0, T0)
    assert c.Rematch() not in legal(state, 1, T0)
    refuse(state, 1, c.Rematch(), "rematch_already_offered")
    state, events = apply(state, 0, c.Rematch(), T0)
    assert events == [
        RematchOffered(match=1, seat=0),
        RematchAccepted(match=2),
        MatchStarted(match=2, options=TableOptions(target=1, gin_bonus=40)),
    ]
    assert state.match == 2
    assert state.status == "playing"
    assert state.scores == (0, 0)
    assert state.hands_won == (0, 0)
    assert state.options == TableOptions(target=1, gin_bonus=40)
    assert state.needs_deal
    # the first dealer is drawn by lot again, not the last winner
    state, started = deal(state, list(range(52)), SALT, lot, T0)
    assert started[0].match == 2
    assert (started[0].dealer, started[0].reason) == (lot, "lot")


@pytest.mark.parametrize(
    ("command", "reason"), [(c.DeclineRematch(), "rematch_declined"), (c.Leave(), "left")]
)
def test_r9_4_declining_or_leaving_closes_the_table(command, reason):
    state = finished()
    state, _ = apply(state, 1, c.Rematch(), T0)
    state, events = apply(state, 0, command, T0)
    assert events == [TableClosed(reason=reason)]
    assert state.status == "closed"
    assert state.result.winner == 0  # the result stays
    assert legal(state, 0, T0) == []
    assert legal(state, 1, T0) == []
    refuse(state, 1, c.Rematch(), "table_closed")
    refuse(state, 0, c.Rematch(), "table_closed")
    refuse(state, 0, c.Leave(), "table_closed")


def test_r9_4_no_rematch_during_a_match():
    state = start(list(range(52)))
    refuse(state, 0, c.Rematch(), "match_not_over")
    refuse(state, 1, c.DeclineRematch(), "match_not_over")


# --- R10.2 and R10.3 through Timing ----------------------------------------------------------


def test_r10_2_absence_claim_refused_until_48_hours_then_the_claimer_wins():
    state = start(list(range(52)), dealer=0, now=1000.0)  # seat 1 decides the upcard
    refuse(state, 0, c.ClaimAbsence(), "absence_too_early", now=1000.0 + 47 * HOUR)
    refuse(state, 0, c.ClaimAbsence(), "absence_too_early", now=1000.0 + 48 * HOUR)
    assert c.ClaimAbsence() not in legal(state, 0, Timing(now=1000.0 + 48 * HOUR))
    later = Timing(now=1000.0 + 48 * HOUR + 1)
    assert c.ClaimAbsence() in legal(state, 0, later)
    refuse(state, 1, c.ClaimAbsence(), "not_absent", now=later.now)  # the decision is its own
    state, events = apply(state, 0, c.ClaimAbsence(), later)
    assert hand_ended(events).how == "abandoned"
    ended = match_ended(events)
    assert (ended.winner, ended.reason, ended.by) == (0, "absence", 1)
    assert all(t.game_bonus == 0 and t.box_bonus == 0 for t in ended.tally)


def test_r10_2_the_absence_clock_starts_when_the_decision_changes_hands():
    state = start(list(range(52)), dealer=0, now=0.0)
    state, _ = apply(state, 1, PASS, Timing(now=10 * HOUR))  # now the dealer (0) decides
    refuse(state, 1, c.ClaimAbsence(), "absence_too_early", now=50 * HOUR)
    refuse(state, 0, c.ClaimAbsence(), "not_absent", now=100 * HOUR)
    state, events = apply(state, 1, c.ClaimAbsence(), Timing(now=58 * HOUR + 1))
    assert match_ended(events).winner == 1


def test_r10_3_expiry_refused_before_7_days_then_ends_the_match_with_no_winner():
    state = start(list(range(52)), now=0.0)
    state, _ = apply(state, 1, PASS, Timing(now=DAY))  # a move: the clock restarts
    with pytest.raises(IllegalAction) as info:
        expire(state, Timing(now=DAY + 7 * DAY - 1))
    assert info.value.code == "not_expired"
    state, events = expire(state, Timing(now=DAY + 7 * DAY))
    assert hand_ended(events).how == "abandoned"
    ended = match_ended(events)
    assert (ended.winner, ended.reason) == (None, "expired")
    assert events[-1] == TableExpired()
    assert state.status == "expired"
    refuse(state, 0, c.TakeUpcard(), "table_closed")
    refuse(state, 0, c.Rematch(), "table_closed")
    assert legal(state, 0, T0) == []


def test_r10_3_a_finished_match_keeps_its_result_on_expiry():
    state = finished()
    state, events = expire(state, Timing(now=7 * DAY))
    assert events == [TableExpired()]
    assert state.status == "expired"
    assert state.result.winner == 0
    assert state.result.reason == "target"
