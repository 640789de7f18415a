"""A table's deadlines as the timer service reads them (docs/RULES.md R10.2, R10.3). Pure.

Every change saves them with the table (``store.save_if_current``, the ``deadlines`` table):
- absence: while a hand is on, the seat to act and since when it has the decision (the
  engine's ``decision_since``), with the table event that gave it that decision (the last
  ``hand_started``, ``upcard_passed`` or ``card_discarded``; a draw leaves the decision, and
  its event, as they were: the statement keeps the stored seq when seat and moment are the
  same);
- expiry: while the table is open, its last accepted command's time (the engine's
  ``last_move_at``, or the row's before the match starts) and the table's seq then.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from shared.contracts.envelope import Envelope
from shared.contracts.views import TableStatus
from shared.engine.state import GameState

OPEN: frozenset[TableStatus] = frozenset({"waiting", "playing", "match_over"})
# The events after which the other seat (or, on a deal, the non-dealer) has a new decision.
DECIDING = frozenset({"hand_started", "upcard_passed", "card_discarded"})


class Deadlines(msgspec.Struct, frozen=True, kw_only=True):
    """One table's row of ``deadlines`` after a change."""

    absence_seat: int | None = None
    absence_since: datetime | None = None
    absence_seq: int | None = None  # used only when seat or moment changed
    expiry_since: datetime | None = None
    expiry_seq: int | None = None


def deadlines_of(
    status: TableStatus,
    state: GameState | None,
    last_move_at: datetime,
    seq: int,
    envelopes: Sequence[Envelope] = (),
) -> Deadlines:
    """The deadlines of a table with this status, state, row ``last_move_at`` and ``seq``,
    right after the change that wrote ``envelopes``."""
    if status not in OPEN:
        return Deadlines()
    moved = last_move_at if state is None else at(state.last_move_at)
    if state is None or state.status != "playing" or state.hand is None:
        return Deadlines(expiry_since=moved, expiry_seq=seq)
    deciding = [e.seq for e in envelopes if e.type in DECIDING]
    return Deadlines(
        absence_seat=state.hand.to_act,
        absence_since=at(state.decision_since),
        absence_seq=deciding[-1] if deciding else seq,
        expiry_since=moved,
        expiry_seq=seq,
    )


def at(timestamp: float) -> datetime:
    """A clock reading (the engine's float seconds) as an aware UTC datetime."""
    return datetime.fromtimestamp(timestamp, UTC)
