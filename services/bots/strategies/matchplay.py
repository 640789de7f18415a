"""Playing for the match: the chance of winning it from a score, for any target (R9.1).

Points are worth what they change in the chance of reaching the target first. The chance is
computed once per target by dynamic programming over both scores, with each hand won by
either seat alike and a typical spread of hand values (knocks, gins, undercuts). Targets other
than 100 are scaled to a 100-point grid.
"""

from __future__ import annotations

from functools import cache

GRID = 100
# A hand's winner scores about this many points (on a 100-point target), this often.
HAND_POINTS = (
    (5, 0.12),
    (10, 0.15),
    (15, 0.14),
    (20, 0.12),
    (25, 0.10),
    (30, 0.10),
    (35, 0.08),
    (40, 0.07),
    (50, 0.07),
    (60, 0.05),
)


@cache
def _table() -> tuple[tuple[float, ...], ...]:
    """chance[mine][theirs] of winning the match from those scores, on the 100-point grid."""
    chance = [[0.0] * (GRID + 1) for _ in range(GRID + 1)]
    for mine in range(GRID - 1, -1, -1):
        row = chance[mine]
        for theirs in range(GRID - 1, -1, -1):
            total = 0.0
            for points, p in HAND_POINTS:
                up = mine + points
                total += p * (1.0 if up >= GRID else chance[up][theirs])
                down = theirs + points
                total += p * (0.0 if down >= GRID else row[down])
            row[theirs] = total / 2
    return tuple(tuple(row) for row in chance)


def win_chance(mine: int, theirs: int, target: int) -> float:
    """The chance of winning the match from these scores, both players alike."""
    if mine >= target:
        return 1.0
    if theirs >= target:
        return 0.0
    scale = GRID / target
    return _table()[min(GRID - 1, int(mine * scale))][min(GRID - 1, int(theirs * scale))]
