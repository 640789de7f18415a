"""When deadlines are due, and which to look at (docs/RULES.md R10.2, R10.3). Pure.

The table service saves each open table's deadlines with every change of the table
(``gin_table.timer_deadlines``: the seat to act and since when, the last move's time); this
service fires those whose moment is older than the absence or expiry time. It looks at a
window of moments per kind: from a margin before where it last looked up to the newest
moment due now. A moment written after a look that is older than that look's end (a table
replica's clock behind this one's, a commit that took long) is still in the next window when
it is late by less than ``LOOK_BACK``; what was fired is kept (``fired``), so the overlap
fires nothing twice.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

import msgspec

Kind = Literal["absence", "expiry"]
KINDS: tuple[Kind, ...] = ("absence", "expiry")

# R10.2 allows a claim only *more* than the absence time after the turn started, and the
# table service compares its float clock with the stored microsecond timestamp: a deadline
# this much after the exact moment is one the table service always agrees has passed.
MARGIN = timedelta(milliseconds=1)
# How far before its last look a look starts again (clock skew between replicas, and the
# time from a move's clock reading to its commit, are far below this).
LOOK_BACK = timedelta(minutes=2)


class Durations(msgspec.Struct, frozen=True):
    """The absence and expiry times in seconds (``GIN_ABSENCE_AFTER_S``, ``GIN_EXPIRY_AFTER_S``)."""

    absence_after_s: float
    expiry_after_s: float

    def of(self, kind: Kind) -> timedelta:
        """The time after which a deadline of that kind is due."""
        seconds = self.absence_after_s if kind == "absence" else self.expiry_after_s
        return timedelta(seconds=seconds)


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
