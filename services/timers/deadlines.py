"""When deadlines are due, and which to look at (docs/RULES.md R10.2, R10.3). Pure.

The table service saves each open table's deadlines with every change of the table
(``gin_table.timer_deadlines``: the seat to act and since when, the last move's time); this
service fires those whose moment is older than the absence or expiry time. It looks at a
window of moments per kind: from a margin before where it last looked up to the newest
moment due now. A moment written after a look that is older than that look's end (a table
replica's clock behind this one's, a commit that took long) is still in the next window when
it is late by less than ``LOOK_BACK``; what was fired is kept (``fired``), so the overlap
fires nothing twice.

Turn reminders (issue 33) are deadlines of the absence moment too: one kind per offset of
``GIN_TURN_REMINDERS_S`` (``reminder:<seconds>``), each looked at, fired and kept like the
absence itself, so they are exactly as durable.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import msgspec

# "absence", "expiry", or a turn reminder "reminder:<seconds into the turn>".
Kind = str
Source = Literal["absence", "expiry"]  # the deadlines' column a kind's moment is read from
KINDS: tuple[Kind, ...] = ("absence", "expiry")
REMINDER = "reminder:"
DEFAULT_REMINDERS_S = "86400,158400"

# R10.2 allows a claim only *more* than the absence time after the turn started, and the
# table service compares its float clock with the stored microsecond timestamp: a deadline
# this much after the exact moment is one the table service always agrees has passed.
MARGIN = timedelta(milliseconds=1)
# How far before its last look a look starts again (clock skew between replicas, and the
# time from a move's clock reading to its commit, are far below this).
LOOK_BACK = timedelta(minutes=2)


class BadReminders(ValueError):
    """``GIN_TURN_REMINDERS_S`` is not a list of offsets the service can keep."""


def reminder_offsets(text: str, absence_after_s: float) -> tuple[int, ...]:
    """The offsets of ``GIN_TURN_REMINDERS_S`` (whole seconds into a turn, comma-separated,
    increasing, each below the absence time: at the absence time the claimable reminder goes
    anyway); empty for none.

    >>> reminder_offsets("86400, 158400", 172800)
    (86400, 158400)
    >>> reminder_offsets("", 172800)
    ()
    """
    parts = [part.strip() for part in text.split(",")] if text.strip() else []
    offsets: list[int] = []
    for part in parts:
        if not part.isdigit() or int(part) <= 0:
            raise BadReminders(
                f"GIN_TURN_REMINDERS_S={text!r}: {part!r} is not a whole number of seconds above 0"
            )
        offsets.append(int(part))
    if offsets != sorted(set(offsets)):
        raise BadReminders(f"GIN_TURN_REMINDERS_S={text!r}: the offsets must increase, each once")
    if offsets and offsets[-1] >= absence_after_s:
        raise BadReminders(
            f"GIN_TURN_REMINDERS_S={text!r}: {offsets[-1]} s is not before the absence time"
            f" (GIN_ABSENCE_AFTER_S={absence_after_s:g}), when the claimable reminder goes"
        )
    return tuple(offsets)


def reminder_kind(offset_s: int) -> Kind:
    """The kind of the reminder ``offset_s`` into a turn."""
    return f"{REMINDER}{offset_s}"


def reminder_offset(kind: Kind) -> int | None:
    """The offset of a reminder kind (None: not a reminder)."""
    return int(kind.removeprefix(REMINDER)) if kind.startswith(REMINDER) else None


def kinds_of(reminders_s: tuple[int, ...]) -> tuple[Kind, ...]:
    """Every kind of deadline: absence, expiry and one per reminder offset."""
    return KINDS + tuple(reminder_kind(s) for s in reminders_s)


class Durations(msgspec.Struct, frozen=True):
    """The absence and expiry times in seconds (``GIN_ABSENCE_AFTER_S``, ``GIN_EXPIRY_AFTER_S``)
    and the turn reminders' offsets (``GIN_TURN_REMINDERS_S``, checked by
    ``reminder_offsets``)."""

    absence_after_s: float
    expiry_after_s: float
    reminders_s: tuple[int, ...] = ()

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """Every kind of deadline fired: absence, expiry and one per reminder offset."""
        return kinds_of(self.reminders_s)

    def of(self, kind: Kind) -> timedelta:
        """The time after which a deadline of that kind is due."""
        offset = reminder_offset(kind)
        if offset is not None:
            return timedelta(seconds=offset)
        seconds = self.absence_after_s if kind == "absence" else self.expiry_after_s
        return timedelta(seconds=seconds)

    def superseded(self, kind: Kind, since: datetime, now: datetime) -> bool:
        """Whether a reminder of ``kind`` for a turn begun at ``since`` is outdated at ``now``:
        the next reminder (a later offset, or the claimable one) is due already."""
        offset = reminder_offset(kind)
        if offset is None:
            return False
        later = [s for s in self.reminders_s if s > offset]
        after = timedelta(seconds=later[0]) if later else self.of("absence") + MARGIN
        return now >= since + after


def source(kind: Kind) -> Source:
    """The deadlines' column whose moment a kind is counted from."""
    return "expiry" if kind == "expiry" else "absence"


class Window(msgspec.Struct, frozen=True):
    """The moments to look at: after ``start``, up to and including ``end``."""

    start: datetime
    end: datetime


def window(kind: Kind, scanned_to: datetime, now: datetime, durations: Durations) -> Window:
    """The moments whose deadline of ``kind`` is due at ``now``, from a look that last reached
    ``scanned_to`` (1970 when it never looked)."""
    end = now - durations.of(kind) - MARGIN
    return Window(start=min(scanned_to - LOOK_BACK, end), end=end)


def due_at(kind: Kind, since: datetime, durations: Durations) -> datetime:
    """When a deadline of ``kind`` whose moment is ``since`` is due."""
    return since + durations.of(kind) + MARGIN


class Due(msgspec.Struct, frozen=True, kw_only=True):
    """A deadline to fire: its table, the seat (absence), its moment, the table event that
    set it, and how often it was fired before (an expiry sent again)."""

    table_id: str
    kind: Kind
    seat: int | None
    since: datetime
    seq: int
    attempts: int = 0
