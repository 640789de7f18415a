"""The bot strategies: pure functions ``decide(view, rng) -> command`` of a seat's view.

``STRATEGIES`` maps each level (R10.8) to its strategy; ``load`` also takes ``module:callable``
so a tournament can pit any strategy against them.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from typing import cast

from services.bots.strategies import carmen, luna, tito
from services.bots.strategies.knowledge import NoDecision
from shared.contracts import commands as c
from shared.contracts.views import TableView

Strategy = Callable[[TableView, random.Random], c.Command]

STRATEGIES: dict[str, Strategy] = {
    "tito": tito.decide,
    "carmen": carmen.decide,
    "luna": luna.decide,
}


def load(spec: str) -> Strategy:
    """The strategy of a level name (``luna``) or of ``module:callable``."""
    if spec in STRATEGIES:
        return STRATEGIES[spec]
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        levels = ", ".join(STRATEGIES)
        raise ValueError(f"unknown strategy {spec!r}: use one of {levels} or module:callable")
    target: object = importlib.import_module(module_name)
    for part in name.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    return cast(Strategy, target)


__all__ = ["STRATEGIES", "NoDecision", "Strategy", "load"]
