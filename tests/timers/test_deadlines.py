"""The pure rules of the deadlines (R10.2, R10.3): which deadlines the table service saves with
a change (services/table/deadlines.py ``deadlines_of``, from states the real engine makes), and
which moments the timer service looks at (services/timers/deadlines.py ``window``, ``due_at``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from services.table.deadlines import Deadlines, deadlines_of
from services.timers.deadlines import LOOK_BACK, MARGIN, Durations, Kind, due_at, window
from shared.contracts import commands as c
from shared.contracts.envelope import Envelope, wrap
from shared.contracts.events import AnyEvent, MessagePosted, Player, SeatTaken
from shared.contracts.options import TableOptions
from shared.engine import GameState, Timing, apply, deal, new_game, to_act
from shared.engine.cards import CARDS
from tests.engine.helpers import SALT, knock_by, rigged_deck

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DURATIONS = Durations(absence_after_s=48 * 3600.0, expiry_after_s=7 * 86400.0)
ABSENCE = timedelta(hours=48)
EXPIRY = timedelta(days=7)
WIN9 = "Ac 2c 3c 4d 5d 6d 7h 8h 9h 9s"  # 9 points of deadwood: knocks
LOSE10 = "Jc Jd Js Qc Qd Qs 2s 3s 4s Kh"  # nothing to lay off on WIN9


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def clock(minutes: float) -> float:
    return at(minutes).timestamp()


def envelopes(first_seq: int, events: Sequence[AnyEvent], minutes: float) -> list[Envelope]:
    """A change's events as the table service numbers them: seqs from ``first_seq``."""
    return [wrap("t1", first_seq + i, e, at(minutes)) for i, e in enumerate(events)]


class Table:
    """A table through the real engine, its events numbered as the table service does."""

    def __init__(self, dealer: int = 0, options: TableOptions | None = None) -> None:
        # seq 1 table_created, 2 seat_taken (the creator): the change that sits the second
        # player starts the match and deals (services/table/tables.py ``_sit``) at minute 0.
        self.state, started = new_game(options or TableOptions(), Timing(now=clock(0)))
        deck = rigged_deck(WIN9, LOSE10, upcard="Kd", stock="Kc Ks")
        self.state, dealt = deal(self.state, deck, SALT, dealer, Timing(now=clock(0)))
        sat = SeatTaken(seat=1, player=Player(id="b", name="Bia"))
        self.seq = 2
        self.change: list[Envelope] = []
        self.record([sat, *started, *dealt], 0)

    def record(self, events: Sequence[AnyEvent], minutes: float) -> None:
        self.change = envelopes(self.seq + 1, events, minutes)
        self.seq += len(events)

    def play(self, command: c.Command, minutes: float) -> None:
        seat = to_act(self.state)
        assert seat is not None
        self.state, events = apply(self.state, seat, command, Timing(now=clock(minutes)))
        self.record(events, minutes)

    def deadlines(self, status: str = "playing", row_moved: float = -60.0) -> Deadlines:
        return deadlines_of(
            status,  # type: ignore[arg-type]
            self.state,
            at(row_moved),
            self.seq,
            self.change,
        )


def absence_and_expiry(
    seat: int, since: float, seq: int, moved: float, expiry_seq: int
) -> Deadlines:
    return Deadlines(
        absence_seat=seat,
        absence_since=at(since),
        absence_seq=seq,
        expiry_since=at(moved),
        expiry_seq=expiry_seq,
    )


def knocked(options: TableOptions) -> tuple[GameState, list[AnyEvent]]:
    """A game whose first hand seat 0 ended by knocking (tests/engine's ``knock_by``)."""
    state, _ = new_game(options, Timing(now=clock(0)))
    return knock_by(state, 0, WIN9, LOSE10)


# --- deadlines_of: what a change saves ---------------------------------------------------


def test_r10_3_a_waiting_table_has_only_its_expiry_since_the_rows_last_move() -> None:
    change = envelopes(1, [SeatTaken(seat=0, player=Player(id="a", name="Ana"))], 5)
    assert deadlines_of("waiting", None, at(5), 2, change) == Deadlines(
        expiry_since=at(5), expiry_seq=2
    )


@pytest.mark.parametrize("dealer", [0, 1])
def test_r10_2_when_a_hand_starts_the_non_dealer_has_the_decision_since_the_deal(
    dealer: int,
) -> None:
    table = Table(dealer=dealer)
    # seqs 3 seat_taken, 4 match_started, 5 hand_started: the deal is the deciding event
    assert [e.type for e in table.change] == ["seat_taken", "match_started", "hand_started"]
    assert table.deadlines() == absence_and_expiry(1 - dealer, 0, 5, moved=0, expiry_seq=5)


def test_r10_2_a_pass_gives_the_other_seat_the_decision_since_the_pass() -> None:
    table = Table(dealer=0)
    table.play(c.PassUpcard(), 30)  # seq 6: the non-dealer (1) passes
    assert table.deadlines() == absence_and_expiry(0, 30, 6, moved=30, expiry_seq=6)
    table.play(c.PassUpcard(), 50)  # seq 7: both passed, R4.4: the non-dealer draws first
    assert table.deadlines() == absence_and_expiry(1, 50, 7, moved=50, expiry_seq=7)


def test_r10_2_a_draw_keeps_the_seat_and_its_clock_and_r10_3_moves_the_expiry() -> None:
    table = Table(dealer=0)
    table.play(c.PassUpcard(), 30)
    table.play(c.PassUpcard(), 50)
    table.play(c.Draw(source="stock"), 55)  # seq 8 card_drawn: no deciding event
    due = table.deadlines()
    # The same decision since minute 50; its seq is the change's (the save keeps the stored
    # one, 7, because seat and moment did not change: services/table/store.py).
    assert due == absence_and_expiry(1, 50, 8, moved=55, expiry_seq=8)


def test_r10_2_a_discard_gives_the_other_seat_the_decision_with_the_discards_seq() -> None:
    table = Table(dealer=0)
    table.play(c.TakeUpcard(), 20)  # seq 6: seat 1 takes the upcard, keeps its decision
    assert table.deadlines() == absence_and_expiry(1, 0, 6, moved=20, expiry_seq=6)
    hand = table.state.hand
    assert hand is not None
    card = next(str(CARDS[x]) for x in range(52) if hand.hands[1] >> x & 1 and x != hand.taken)
    table.play(c.Discard(card=card), 25)  # seq 7 card_discarded
    assert table.change[-1].type == "card_discarded"
    assert table.deadlines() == absence_and_expiry(0, 25, 7, moved=25, expiry_seq=7)


def test_r10_2_the_last_deciding_event_of_a_change_gives_the_seq() -> None:
    table = Table(dealer=0)
    table.play(c.PassUpcard(), 30)
    # One change with a pass (deciding) then a chat line (not): the pass's seq, the change's
    # last seq for the expiry.
    table.state, events = apply(table.state, 0, c.PassUpcard(), Timing(now=clock(40)))
    chat = MessagePosted(message_id=1, seat=0, name="Ana", text="oi")
    table.record([*events, chat], 40)
    assert [e.type for e in table.change] == ["upcard_passed", "message_posted"]
    assert table.deadlines() == absence_and_expiry(1, 40, 7, moved=40, expiry_seq=8)


def test_r10_2_no_absence_between_hands_r10_3_the_expiry_stays() -> None:
    state, events = knocked(TableOptions())
    assert state.status == "playing"
    assert state.hand is None
    moved = datetime.fromtimestamp(state.last_move_at, UTC)
    change = envelopes(20, events, 70)
    assert deadlines_of("playing", state, at(0), 20 + len(events) - 1, change) == Deadlines(
        expiry_since=moved, expiry_seq=20 + len(events) - 1
    )


def test_r10_2_no_absence_at_match_over_r10_3_the_expiry_stays() -> None:
    state, events = knocked(TableOptions(target=1))
    assert state.status == "match_over"
    assert [type(e).__name__ for e in events][-1] == "MatchEnded"
    moved = datetime.fromtimestamp(state.last_move_at, UTC)
    change = envelopes(20, events, 70)
    assert deadlines_of("match_over", state, at(0), 21, change) == Deadlines(
        expiry_since=moved, expiry_seq=21
    )


@pytest.mark.parametrize("status", ["closed", "expired"])
def test_r10_3_a_closed_or_expired_table_has_no_deadline(status: str) -> None:
    table = Table(dealer=0)
    table.play(c.PassUpcard(), 30)  # a hand on: only the status says the table is done
    assert table.deadlines(status) == Deadlines()
    assert deadlines_of(status, None, at(0), 3, []) == Deadlines()  # type: ignore[arg-type]


def test_r10_3_the_expiry_is_the_engines_last_move_not_the_rows() -> None:
    table = Table(dealer=0)
    table.play(c.PassUpcard(), 30)
    due = table.deadlines(row_moved=99)
    assert due.expiry_since == at(30)


def test_r10_2_a_change_without_events_keeps_the_decision_with_the_changes_seq() -> None:
    table = Table(dealer=0)
    table.play(c.PassUpcard(), 30)
    table.change = []  # e.g. deadlines filled in from the state alone (the backfill)
    assert table.deadlines() == absence_and_expiry(0, 30, 6, moved=30, expiry_seq=6)


# --- window and due_at: which moments are due ----------------------------------------------

NOW = T0 + timedelta(days=30)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("kind", "after"), [("absence", ABSENCE), ("expiry", EXPIRY)])
def test_r10_2_r10_3_a_deadline_is_due_its_time_and_a_margin_after_its_moment(
    kind: Kind, after: timedelta
) -> None:
    assert DURATIONS.of(kind) == after
    assert due_at(kind, T0, DURATIONS) == T0 + after + MARGIN
    assert timedelta(0) < MARGIN  # R10.2: *more* than the absence time


def test_r10_2_r10_3_the_durations_come_from_the_settings() -> None:
    short = Durations(absence_after_s=2.0, expiry_after_s=5.0)
    assert due_at("absence", T0, short) == T0 + timedelta(seconds=2) + MARGIN
    assert due_at("expiry", T0, short) == T0 + timedelta(seconds=5) + MARGIN
    assert window("absence", EPOCH, NOW, short).end == NOW - timedelta(seconds=2) - MARGIN


@pytest.mark.parametrize("kind", ["absence", "expiry"])
def test_r10_2_r10_3_the_window_ends_at_the_newest_moment_due_now(kind: Kind) -> None:
    look = window(kind, EPOCH, NOW, DURATIONS)
    assert look.end == NOW - DURATIONS.of(kind) - MARGIN
    assert due_at(kind, look.end, DURATIONS) == NOW  # the end's deadline is due exactly now
    later = look.end + timedelta(microseconds=1)
    assert due_at(kind, later, DURATIONS) > NOW  # the next moment is not due yet


@pytest.mark.parametrize("kind", ["absence", "expiry"])
def test_r10_2_r10_3_a_first_look_starts_before_any_moment(kind: Kind) -> None:
    look = window(kind, EPOCH, NOW, DURATIONS)
    assert look.start == EPOCH - LOOK_BACK


@pytest.mark.parametrize("kind", ["absence", "expiry"])
def test_r10_2_r10_3_a_look_starts_look_back_before_where_the_last_one_reached(
    kind: Kind,
) -> None:
    reached = NOW - DURATIONS.of(kind) - timedelta(seconds=30)
    look = window(kind, reached, NOW, DURATIONS)
    assert look.start == reached - LOOK_BACK  # a moment saved late is still looked at
    assert look.end == NOW - DURATIONS.of(kind) - MARGIN


@pytest.mark.parametrize("kind", ["absence", "expiry"])
def test_r10_2_r10_3_a_look_ahead_of_this_clock_looks_at_nothing(kind: Kind) -> None:
    # another replica's clock ahead by more than LOOK_BACK: nothing is due here yet
    reached = NOW - DURATIONS.of(kind) + LOOK_BACK + timedelta(seconds=1)
    look = window(kind, reached, NOW, DURATIONS)
    assert look.start == look.end  # empty: moments are > start and <= end


def test_r10_2_r10_3_look_back_is_far_above_the_margin() -> None:
    assert LOOK_BACK >= timedelta(minutes=1) > MARGIN
    assert msgspec.structs.astuple(window("absence", NOW, NOW, DURATIONS)) == (
        NOW - ABSENCE - MARGIN,
        NOW - ABSENCE - MARGIN,
    )


# --- turn reminders (issue 33): kinds of the absence moment ----------------------------------

REMINDING = Durations(absence_after_s=300.0, expiry_after_s=3600.0, reminders_s=(100, 200))


def test_each_reminder_offset_is_a_kind_of_its_own() -> None:
    assert REMINDING.kinds == ("absence", "expiry", "reminder:100", "reminder:200")
    assert DURATIONS.kinds == ("absence", "expiry")  # none configured: none looked for
    assert due_at("reminder:100", T0, REMINDING) == T0 + timedelta(seconds=100) + MARGIN
    look = window("reminder:200", EPOCH, NOW, REMINDING)
    assert look.end == NOW - timedelta(seconds=200) - MARGIN


@pytest.mark.parametrize(
    ("kind", "waited_s", "outdated"),
    [
        ("reminder:100", 150, False),
        ("reminder:100", 200, True),  # the 200 s reminder is due: it says more
        ("reminder:200", 300, False),  # R10.2: claimable only *after* the absence time
        ("reminder:200", 301, True),  # the claimable reminder is due
        ("absence", 10_000, False),  # never outdated: the claimable one goes with it
        ("expiry", 10_000, False),
    ],
)
def test_a_reminder_is_outdated_once_the_next_one_is_due(
    kind: Kind, waited_s: float, outdated: bool
) -> None:
    assert REMINDING.superseded(kind, T0, T0 + timedelta(seconds=waited_s)) is outdated
