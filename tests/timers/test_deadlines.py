"""The pure rules: which deadlines a table has after each of its events (R10.2, R10.3)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.timers.deadlines import MARGIN, Deadline, Durations, Timers, after_event
from shared.contracts.envelope import Envelope
from shared.contracts.events import (
    AnyEvent,
    CardDiscarded,
    CardDrawn,
    HandEnded,
    HandStarted,
    MatchEnded,
    MatchStarted,
    MessagePosted,
    Player,
    RematchOffered,
    SeatTaken,
    StockLow,
    TableClosed,
    TableCreated,
    TableExpired,
    UpcardPassed,
    UpcardTaken,
)
from shared.contracts.options import TableOptions

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DURATIONS = Durations(absence_after_s=48 * 3600.0, expiry_after_s=7 * 86400.0)
ABSENCE = timedelta(hours=48)
EXPIRY = timedelta(days=7)


def env(seq: int, event: AnyEvent, minutes: float = 0.0) -> Envelope:
    return Envelope(
        id=uuid.uuid4(),
        type=event.__struct_config__.tag,  # type: ignore[arg-type]
        table_id="t1",
        seq=seq,
        occurred_at=T0 + timedelta(minutes=minutes),
        data=event,
    )


def hand_started(dealer: int) -> HandStarted:
    return HandStarted(
        match=1,
        hand=1,
        dealer=dealer,
        reason="lot",
        upcard="5H",
        stock_count=31,
        knock_limit=10,
        deck_commitment="x",
    )


def hand_ended() -> HandEnded:
    return HandEnded(
        match=1,
        hand=1,
        how="knock",
        winner=0,
        points=10,
        seats=[],
        layoffs=[],
        scores=[10, 0],
        hands_won=[1, 0],
        deck=[],
        salt="s",
    )


def match_ended(winner: int | None, reason: str = "target") -> MatchEnded:
    return MatchEnded(match=1, winner=winner, reason=reason, tally=[])  # type: ignore[arg-type]


def run(*envelopes: Envelope, start: Timers | None = None) -> Timers:
    timers = start or Timers()
    for envelope in envelopes:
        nxt = after_event(timers, envelope, DURATIONS)
        assert nxt is not None, f"seq {envelope.seq} was ignored"
        timers = nxt
    return timers


def absence(seat: int, minutes: float, seq: int) -> Deadline:
    since = T0 + timedelta(minutes=minutes)
    return Deadline(
        kind="absence", seat=seat, since=since, seq=seq, due_at=since + ABSENCE + MARGIN
    )


def expiry(minutes: float, seq: int) -> Deadline:
    since = T0 + timedelta(minutes=minutes)
    return Deadline(kind="expiry", seat=None, since=since, seq=seq, due_at=since + EXPIRY + MARGIN)


def started(dealer: int = 0) -> list[Envelope]:
    """A table created, joined, its match started and the first hand dealt, at minute 0."""
    ana, bia = Player(id="a", name="Ana"), Player(id="b", name="Bia")
    return [
        env(1, TableCreated(options=TableOptions(), creator=ana)),
        env(2, SeatTaken(seat=0, player=ana)),
        env(3, SeatTaken(seat=1, player=bia)),
        env(4, MatchStarted(match=1, options=TableOptions())),
        env(5, hand_started(dealer)),
    ]


def test_a_waiting_table_has_only_its_expiry() -> None:
    timers = run(*started()[:2])
    assert timers == Timers(last_seq=2, absence=None, expiry=expiry(0, 2))


@pytest.mark.parametrize("dealer", [0, 1])
def test_r10_2_the_non_dealer_has_the_upcard_decision_when_a_hand_starts(dealer: int) -> None:
    timers = run(*started(dealer))
    assert timers.absence == absence(1 - dealer, 0, 5)
    assert timers.expiry == expiry(0, 5)


def test_r10_2_a_pass_gives_the_decision_to_the_other_seat_and_restarts_its_clock() -> None:
    timers = run(*started(dealer=0), env(6, UpcardPassed(hand=1, seat=1), minutes=30))
    assert timers.absence == absence(0, 30, 6)
    both = run(env(7, UpcardPassed(hand=1, seat=0, reason="both_passed_upcard"), 50), start=timers)
    assert both.absence == absence(1, 50, 7)  # R4.4: the non-dealer draws first


def test_r10_2_taking_or_drawing_keeps_the_decision_and_its_clock() -> None:
    timers = run(*started(dealer=0), env(6, UpcardTaken(hand=1, seat=1, card="5H"), minutes=20))
    assert timers.absence == absence(1, 0, 5)  # the same decision: since minute 0
    assert timers.expiry == expiry(20, 6)  # but it was a move
    timers = run(env(7, CardDiscarded(hand=1, seat=1, card="KS"), 25), start=timers)
    assert timers.absence == absence(0, 25, 7)
    timers = run(
        env(8, CardDrawn(hand=1, seat=0, source="stock", stock_count=4), 26),
        env(9, StockLow(hand=1, stock_count=4), 26),
        start=timers,
    )
    assert timers.absence == absence(0, 25, 7)
    assert timers.expiry == expiry(26, 9)


def test_a_draw_by_the_seat_not_to_act_means_a_missed_event_and_starts_its_turn() -> None:
    timers = run(*started(dealer=0))
    drawn = run(env(9, CardDrawn(hand=1, seat=0, source="stock", stock_count=30), 40), start=timers)
    assert drawn.absence == absence(0, 40, 9)


def test_a_hand_or_match_end_clears_the_absence_until_the_next_deal() -> None:
    timers = run(*started(dealer=0), env(6, hand_ended(), 10))
    assert timers.absence is None
    assert timers.expiry == expiry(10, 6)
    dealt = run(env(7, hand_started(dealer=1), 10), start=timers)
    assert dealt.absence == absence(0, 10, 7)
    over = run(env(8, hand_ended(), 11), env(9, match_ended(0), 11), start=dealt)
    assert over.absence is None
    assert over.expiry == expiry(11, 9)  # R10.3: a finished match's table still expires
    offered = run(env(10, RematchOffered(match=1, seat=0), 70), start=over)
    assert offered == Timers(last_seq=10, absence=None, expiry=expiry(70, 10))


@pytest.mark.parametrize("end", [TableClosed(reason="left"), TableExpired()])
def test_a_closed_or_expired_table_drops_both(end: AnyEvent) -> None:
    timers = run(*started(), env(6, end, 5))
    assert timers == Timers(last_seq=6)


def test_r10_3_chat_moves_nothing() -> None:
    timers = run(*started())
    chat = run(env(6, MessagePosted(message_id=1, seat=0, name="Ana", text="oi"), 90), start=timers)
    assert chat == Timers(last_seq=6, absence=timers.absence, expiry=timers.expiry)


def test_a_seq_applied_already_is_ignored() -> None:
    timers = run(*started())
    for seq in (1, 4, 5):
        assert after_event(timers, started()[seq - 1], DURATIONS) is None


def test_a_gap_is_applied_from_the_event_itself() -> None:
    # events published before the timer service's queue existed are never seen
    timers = run(env(40, UpcardPassed(hand=3, seat=0), 5))
    assert timers == Timers(last_seq=40, absence=absence(1, 5, 40), expiry=expiry(5, 40))


def test_durations_come_from_the_settings() -> None:
    short = Durations(absence_after_s=2.0, expiry_after_s=5.0)
    timers = after_event(Timers(), started(dealer=1)[4], short)
    assert timers is not None
    assert timers.absence is not None
    assert timers.expiry is not None
    assert timers.absence.due_at == T0 + timedelta(seconds=2) + MARGIN
    assert timers.expiry.due_at == T0 + timedelta(seconds=5) + MARGIN
