"""A table's deadlines after one of its public events (docs/RULES.md R10.2, R10.3). Pure.

The timer service reads no other service's tables, so it follows the turn from the events:
after ``hand_started`` the non-dealer decides (the upcard); after ``upcard_passed`` or
``card_discarded`` by seat s, seat 1 - s; ``upcard_taken`` and ``card_drawn`` leave the
decision with the same seat, and its clock runs on (as the engine's ``decision_since``).
``hand_ended`` and ``match_ended`` clear the absence deadline until the next deal;
``table_closed`` and ``table_expired`` drop both. Every table event comes from an accepted
command, so each one moves the expiry; chat does not count (R10.3).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import msgspec

from shared.contracts.envelope import Envelope
from shared.contracts.events import (
    AbsenceClaimable,
    CardDiscarded,
    CardDrawn,
    HandEnded,
    HandStarted,
    MatchEnded,
    MessagePosted,
    TableClosed,
    TableExpired,
    UpcardPassed,
    UpcardTaken,
)

Kind = Literal["absence", "expiry"]
KINDS: tuple[Kind, ...] = ("absence", "expiry")

# R10.2 allows a claim only *more* than the absence time after the turn started, and the
# table service compares its float clock with the event's microsecond timestamp: a deadline
# this much after the exact moment is one the table service always agrees has passed.
MARGIN = timedelta(milliseconds=1)


class Durations(msgspec.Struct, frozen=True):
    """The absence and expiry times in seconds (``GIN_ABSENCE_AFTER_S``, ``GIN_EXPIRY_AFTER_S``)."""

    absence_after_s: float
    expiry_after_s: float


class Deadline(msgspec.Struct, frozen=True, kw_only=True):
    """One deadline of one table: when it is due, and the event that set it."""

    kind: Kind
    seat: int | None  # absence: the seat whose decision it is; expiry: None
    since: datetime  # absence: when the decision became the seat's; expiry: the last move
    seq: int  # the table event that set ``since``
    due_at: datetime


class Timers(msgspec.Struct, frozen=True, kw_only=True):
    """What the timer service keeps of one table: the last seq applied and its deadlines."""

    last_seq: int = 0
    absence: Deadline | None = None
    expiry: Deadline | None = None

    def get(self, kind: Kind) -> Deadline | None:
        """The deadline of that kind, if any."""
        return self.absence if kind == "absence" else self.expiry


def after_event(timers: Timers, envelope: Envelope, durations: Durations) -> Timers | None:
    """The table's deadlines after ``envelope``; None when its seq was applied already.

    A seq past ``last_seq + 1`` (events published before this service's queue existed) is
    applied too: each rule below needs only the event itself, the deadline it replaces and
    at worst starts a turn's clock later than the table did, so a claim is never announced
    early.
    """
    seq = envelope.seq
    if seq <= timers.last_seq:
        return None
    event = envelope.data
    if isinstance(event, (TableClosed, TableExpired)):
        return Timers(last_seq=seq)
    if isinstance(event, (MessagePosted, AbsenceClaimable)):  # not accepted commands
        return msgspec.structs.replace(timers, last_seq=seq)
    at = envelope.occurred_at
    expiry = Deadline(
        kind="expiry",
        seat=None,
        since=at,
        seq=seq,
        due_at=at + timedelta(seconds=durations.expiry_after_s) + MARGIN,
    )
    return Timers(
        last_seq=seq,
        absence=_absence_after(timers.absence, envelope, durations),
        expiry=expiry,
    )


def _absence_after(
    current: Deadline | None, envelope: Envelope, durations: Durations
) -> Deadline | None:
    event = envelope.data

    def turn_of(seat: int) -> Deadline:
        at = envelope.occurred_at
        return Deadline(
            kind="absence",
            seat=seat,
            since=at,
            seq=envelope.seq,
            due_at=at + timedelta(seconds=durations.absence_after_s) + MARGIN,
        )

    match event:
        case HandStarted(dealer=dealer):
            return turn_of(1 - dealer)
        case UpcardPassed(seat=seat) | CardDiscarded(seat=seat):
            return turn_of(1 - seat)
        case UpcardTaken(seat=seat) | CardDrawn(seat=seat):
            # Same seat, same decision: its clock runs on. Another seat means an event was
            # missed; the turn is that seat's from now on.
            return current if current is not None and current.seat == seat else turn_of(seat)
        case HandEnded() | MatchEnded():
            return None
        case _:
            return current
