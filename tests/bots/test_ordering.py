"""The levels are ordered (R10.8, issue 18): LUNA beats CARMEN, CARMEN beats TITO.

Short seeded mirrored tournaments, far from their thresholds: each asserts that the lower end
of the 95% interval of the stronger level's share of the matches is above one half. The
strength figures themselves come from ``python -m bench bots`` (2,000 matches a pairing).
"""

from __future__ import annotations

import pytest

from services.bots import tournament


@pytest.mark.parametrize(
    ("stronger", "weaker", "matches", "target"),
    [("luna", "carmen", 160, 25), ("carmen", "tito", 300, 100)],
)
def test_stronger_level_wins_most_matches(
    stronger: str, weaker: str, matches: int, target: int
) -> None:
    result = tournament.run((stronger, weaker), matches, 18, 2, progress=False, target=target)
    low, _ = result["ci95"]
    assert low > 0.5, result
