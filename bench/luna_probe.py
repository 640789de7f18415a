"""LUNA's tuning probes (issue 35): her variants and her ceilings, as tournament strategies.

A probe is LUNA with some of her ``Style`` changed, always or only against an opponent whose
last hand showed it passing up a knock (``Mind.waited``), and optionally a *ceiling*: LUNA
given the opponent's real hand in place of her sampled ones, for the knock decision (``knock``),
for the discard prices (``feed``: what a discard feeds and the knock threat; ``fed`` or
``threat``: one of the two only) or for all of them (``all``). With ``share`` below 1, each
sampled hand is the real one only with that chance: a sharper posterior, not an oracle. A
ceiling reads the game state, which no view holds, so it measures how much of LUNA's strength
a better opponent model could buy; it is never a bot.

The probe is set by the ``LUNA_PROBE`` environment variable (JSON), read when this module is
imported, so the tournament's worker processes see it::

    LUNA_PROBE='{"waited": {"wait_rounds": 6}, "ceiling": "knock"}' \\
      python -m services.bots.tournament --a bench.luna_probe:decide \\
        --b services.bots.strategies.hunter:decide --matches 400 --seed 21 --workers 2
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
from typing import Any

import msgspec

from services.bots.strategies import luna
from shared.contracts import commands as c
from shared.contracts.views import TableView
from shared.engine.state import GameState

CEILINGS = ("knock", "feed", "fed", "threat", "all")


class Probe(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A LUNA variant: Style fields changed always, and only against a patient opponent."""

    style: dict[str, Any] = {}
    waited: dict[str, Any] = {}
    ceiling: str | None = None
    share: float = 1.0  # the chance that a hand the ceiling sees is the real one


def styles(probe: Probe) -> tuple[luna.Style, luna.Style]:
    """The variant's style, and its style against an opponent seen passing up a knock."""
    names = {f.name for f in dataclasses.fields(luna.Style)}
    unknown = sorted((set(probe.style) | set(probe.waited)) - names)
    if unknown:
        raise ValueError(f"not fields of luna.Style: {', '.join(unknown)}")
    if probe.ceiling is not None and probe.ceiling not in CEILINGS:
        raise ValueError(f"ceiling must be one of {', '.join(CEILINGS)}")
    if not 0.0 < probe.share <= 1.0:
        raise ValueError("share must be above 0 and at most 1")
    base = dataclasses.replace(luna.STYLE, **probe.style)
    return base, dataclasses.replace(base, **probe.waited)


PROBE = msgspec.json.decode(os.environ.get("LUNA_PROBE", "{}"), type=Probe)
STYLE, WAITED = styles(PROBE)
deciding: list[GameState] = []  # the state of the decision being made (ceilings only)
seen_by_ceiling = [0]  # decisions whose opponent hands were the real one (for the tests)


class ProbeMind(luna.Mind):
    """LUNA's mind with the probe's style against a patient opponent, and its ceiling."""

    def opponents(self, count: int) -> list[int]:
        """The sampled hands, with the real one in their place where the ceiling sees it."""
        ceiling = PROBE.ceiling
        seen = ceiling == "all" or (
            (ceiling == "knock" and count == self.style.knock_samples)
            or (ceiling in ("feed", "fed", "threat") and count == self.style.feed_samples)
        )
        return self.seen(count) if seen else super().opponents(count)

    def seen(self, count: int) -> list[int]:
        """``count`` hands, each the real one with the chance ``share`` (all of them at 1)."""
        hand = deciding[-1].hand if deciding else None
        if hand is None:
            return super().opponents(count)
        seen_by_ceiling[0] += 1
        real = hand.hands[1 - self.k.seat]
        if PROBE.share >= 1.0:
            return [real] * count
        rng = random.Random(f"{self.k.hand}/{self.k.stock_count}/{count}")
        return [real if rng.random() < PROBE.share else h for h in super().opponents(count)]


def discard_costs(mind: luna.Mind, allowed: int) -> dict[int, float]:
    """LUNA's discard prices, with the ceiling's hands for only the part it sees (``fed`` or
    ``threat``); any other mind prices as LUNA always does."""
    if not isinstance(mind, ProbeMind) or PROBE.ceiling not in ("fed", "threat"):
        return _discard_costs(mind, allowed)
    seen = mind.opponents(mind.style.feed_samples)
    sampled = luna.Mind.opponents(mind, mind.style.feed_samples)
    fed, threat = (seen, sampled) if PROBE.ceiling == "fed" else (sampled, seen)
    return luna.price_discards(mind, allowed, fed, threat)


def think(view: TableView, rng: random.Random, style: luna.Style) -> luna.Mind:
    """LUNA's ``think``, into a ``ProbeMind`` with the style the evidence calls for (for the
    probe's own decisions only: another LUNA in the process thinks as she always does)."""
    mind = _think(view, rng, style)
    if style is not STYLE:
        return mind
    chosen = WAITED if mind.waited else style
    return ProbeMind(**{**vars(mind), "style": chosen})


def decide(view: TableView, rng: random.Random) -> c.Command:
    """The probe's move."""
    return luna.play(view, rng, STYLE)


def watch_state() -> None:
    """Let a ceiling see each decision's state: wrap the tournament's view builder (in the
    module and in ``__main__`` when the tournament runs as ``python -m``)."""
    from services.bots import tournament
    from shared.engine.view import seat_table_view as build

    def watched(state: GameState, seat: int, *args: Any, **kwargs: Any) -> TableView:
        deciding[:] = [state]
        return build(state, seat, *args, **kwargs)

    for module in (tournament, sys.modules.get("__main__")):
        if module is not None and getattr(module, "seat_table_view", None) is build:
            module.seat_table_view = watched  # type: ignore[attr-defined]


_think = luna.think
luna.think = think
_discard_costs = luna.discard_costs
luna.discard_costs = discard_costs
if PROBE.ceiling is not None:
    watch_state()
