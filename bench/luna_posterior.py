"""How sharp LUNA's opponent model is, in seconds instead of a tournament (issue 35).

The ceilings of ``bench/luna_probe.py`` show that LUNA's strength against the gin hunter rests
on knowing which of her cards the opponent would take: a pile card is taken by such a player
only into a meld. This scorer records LUNA's discard decisions in real matches, with the
opponent's real hand beside each view, and scores an opponent model by how well its sampled
hands predict, for each card she may throw, whether it melds with that hand. The score is the
mean log loss (lower is sharper), by the stock left, against two references:

- ``base rate``: the same chance for every card, the share of cards that meld;
- ``share s``: LUNA's samples with each replaced by the real hand with chance ``s``, the
  probe's ``share`` (so a model's score can be set beside the tournament results of a share).

``python -m bench.luna_posterior --opponent hunter --pairs 25 --seed 99`` prints one JSON
object. A model is a function of LUNA's ``Mind`` and a count, returning that many hands
(``--model module:function``; LUNA's own is ``Mind.opponents``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from bench import luna_probe
from services.bots import tournament
from services.bots.strategies import STRATEGIES, luna
from services.bots.strategies.inference import melds_with
from services.bots.strategies.knowledge import discardable
from shared.contracts import commands as c
from shared.contracts.options import TableOptions
from shared.contracts.views import TableView
from shared.engine.cards import cards_of

Model = Callable[[luna.Mind, int], list[int]]
SHARES = (0.03, 0.08, 0.25)
CLIP = 0.02  # predictions are clipped to [CLIP, 1 - CLIP]: a sampled zero is not certainty
PHASES = ((24, "stock 24+"), (16, "stock 16-23"), (8, "stock 8-15"), (0, "stock 0-7"))


class Decision(msgspec.Struct, frozen=True):
    """One of LUNA's discard decisions: her view and the opponent's real hand then."""

    view: TableView
    opponent: int


def record(opponent: str, pairs: int, seed: int) -> list[Decision]:
    """LUNA's discard decisions in ``pairs`` mirrored matches against ``opponent``."""
    luna_probe.watch_state()
    decisions: list[Decision] = []
    plain = luna.end_turn

    def end_turn(view: TableView, mind: luna.Mind) -> c.Command:
        state = luna_probe.deciding[-1]
        assert state.hand is not None
        decisions.append(Decision(view, state.hand.hands[1 - mind.k.seat]))
        return plain(view, mind)

    luna.end_turn = end_turn
    specs = ("luna", strategy_spec(opponent))
    try:
        for pair in range(pairs):
            for a_seat in (0, 1):
                tournament.play_match(specs, a_seat, seed, pair, TableOptions())
    finally:
        luna.end_turn = plain
    return decisions


def strategy_spec(name: str) -> str:
    """A strategy's spec: a level, ``module:callable``, or a module of the strategies."""
    if name in STRATEGIES or ":" in name:
        return name
    return f"services.bots.strategies.{name}:decide"


@dataclass
class Score:
    """Log loss summed and counted, overall and by the stock left."""

    total: float = 0.0
    count: int = 0

    def add(self, loss: float) -> None:
        """Count one prediction's loss."""
        self.total += loss
        self.count += 1

    @property
    def mean(self) -> float:
        """The mean log loss (0 when nothing was counted)."""
        return round(self.total / self.count, 4) if self.count else 0.0


def log_loss(p: float, melds: bool) -> float:
    """The log loss of predicting ``p`` for an outcome."""
    p = min(max(p, CLIP), 1.0 - CLIP)
    return -math.log(p if melds else 1.0 - p)


def phase_of(stock: int) -> str:
    """The label of the stock-left range a decision falls in."""
    return next(label for low, label in PHASES if stock >= low)


def score(decisions: Sequence[Decision], model: Model, samples: int) -> dict[str, object]:
    """The model's log loss overall and by stock left, beside the base rate and the shares."""
    scores = {name: Score() for name in ("model", *(f"share {s}" for s in SHARES))}
    phases = {label: Score() for _, label in PHASES}
    melded = 0
    for i, d in enumerate(decisions):
        mind = luna.think(d.view, random.Random(i), luna.STYLE)
        hands = model(mind, samples)
        phase = phases[phase_of(mind.k.stock_count)]
        for card in cards_of(discardable(d.view)):
            melds = melds_with(card, d.opponent)
            melded += melds
            p = sum(melds_with(card, hand) for hand in hands) / max(1, len(hands))
            loss = log_loss(p, melds)
            scores["model"].add(loss)
            phase.add(loss)
            for share in SHARES:
                scores[f"share {share}"].add(log_loss((1 - share) * p + share * melds, melds))
    cards = scores["model"].count
    rate = melded / cards if cards else 0.0
    base = Score(melded * log_loss(rate, True) + (cards - melded) * log_loss(rate, False), cards)
    return {
        "decisions": len(decisions),
        "cards": cards,
        "meld_rate": round(rate, 4),
        "log_loss": {"model": scores["model"].mean, "base rate": base.mean}
        | {name: s.mean for name, s in scores.items() if name != "model"},
        "model_by_stock": {label: s.mean for label, s in phases.items()},
    }


def lunas_model(mind: luna.Mind, count: int) -> list[int]:
    """LUNA's own sampled hands."""
    return mind.opponents(count)


def load_model(spec: str | None) -> Model:
    """A model named ``module:function``, or LUNA's own."""
    if spec is None:
        return lunas_model
    module, _, name = spec.partition(":")
    model: Model = getattr(importlib.import_module(module), name)
    return model


def main(argv: Sequence[str] | None = None) -> None:
    """Record LUNA against an opponent and print the model's score as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--opponent",
        default="hunter",
        help="a level, a module of the strategies (hunter, simple) or module:function",
    )
    parser.add_argument("--pairs", type=int, default=25, help="mirrored pairs of matches")
    parser.add_argument("--seed", type=int, default=99)
    parser.add_argument("--samples", type=int, default=32, help="hands sampled per decision")
    parser.add_argument("--model", default=None, help="module:function; LUNA's own by default")
    args = parser.parse_args(argv)
    decisions = record(args.opponent, args.pairs, args.seed)
    result = score(decisions, load_model(args.model), args.samples)
    print(json.dumps({"opponent": args.opponent, "seed": args.seed, **result}))


if __name__ == "__main__":
    main()
