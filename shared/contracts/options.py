"""Table options (RULES.md R9.5): fixed when a table is created and shown to everyone."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Bonus = Annotated[int, msgspec.Meta(ge=0, le=10_000)]
DealerRule = Literal["winner", "loser", "alternate"]


class TableOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The rules a table plays by; the defaults are Selminha's."""

    target: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100
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

    def __post_init__(self) -> None:
        if self.straight_gin and self.oklahoma:
            raise ValueError("straight_gin and oklahoma set the knock limit two ways: choose one")


DEFAULT_OPTIONS = TableOptions()
