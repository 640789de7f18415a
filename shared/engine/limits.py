"""The knock limit of a hand (R6.0): pure, so a bot can work out a past hand's limit from its
record without importing the state machine."""

from __future__ import annotations

from shared.contracts.options import TableOptions
from shared.engine.cards import POINTS


def knock_limit(options: TableOptions, upcard: int) -> int:
    """The hand's knock limit (R6.0): 10, 0 for straight gin, the upcard's value for Oklahoma."""
    if options.straight_gin:
        return 0
    if options.oklahoma:
        return 0 if upcard % 13 == 0 else POINTS[upcard]
    return 10
