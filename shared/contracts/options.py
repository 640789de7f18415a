"""Table options (docs/RULES.md R9.5): fixed when a table is created and shown to everyone."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

MAX_VALUE = 10_000
Bonus = Annotated[int, msgspec.Meta(ge=0, le=MAX_VALUE)]
BONUSES = (
    "gin_bonus",
    "big_gin_bonus",
    "undercut_bonus",
    "box_bonus",
    "game_bonus",
    "shutout_bonus",
)
DealerRule = Literal["winner", "loser", "alternate"]


class TableOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The rules a table plays by; the defaults are Selminha's."""

    target: Annotated[int, msgspec.Meta(ge=1, le=MAX_VALUE)] = 100
    gin_bonus: Bonus = 25
    big_gin_bonus: Bonus = 31
    big_gin: bool = True
    undercut_bonus: Bonus = 25
    box_bonus: Bonus = 25
    game_bonus: Bonus = 100
    shutout_bonus: Bonus = 200
    dealer: DealerRule = "winner"
    straight_gin: bool = False
    oklahoma: bool = False
    hollywood: bool = False  # three games scored at once (R9.6 to R9.12); combines with all

    def __post_init__(self) -> None:
        # msgspec checks the annotated limits only when decoding: check them here too, so an
        # option built in code is refused as surely as one sent over HTTP (R9.5).
        if not 1 <= self.target <= MAX_VALUE:
            raise ValueError(f"target must be from 1 to {MAX_VALUE}")
        for name in BONUSES:
            if not 0 <= getattr(self, name) <= MAX_VALUE:
                raise ValueError(f"{name} must be from 0 to {MAX_VALUE}")
        if self.dealer not in ("winner", "loser", "alternate"):
            raise ValueError("dealer must be winner, loser or alternate")
        if self.straight_gin and self.oklahoma:
            raise ValueError("straight_gin and oklahoma set the knock limit two ways: choose one")


class StrictTableOptions(TableOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Options as a request sends them: an unknown option is refused, not ignored.

    (Events carry ``TableOptions``, which tolerates options added later.)
    """

    def plain(self) -> TableOptions:
        """The same options as the type events and state carry."""
        return TableOptions(**msgspec.structs.asdict(self))
