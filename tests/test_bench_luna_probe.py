"""The LUNA probes of ``bench/luna_probe.py``: their styles, and ceilings that see the hand."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from bench import luna_probe
from bench.luna_probe import Probe, styles
from services.bots.strategies import luna
from services.bots.strategies.knowledge import discardable
from shared.contracts import commands as c
from shared.contracts.events import Player
from shared.contracts.options import TableOptions
from shared.contracts.views import TableView
from shared.engine.game import apply, deal, new_game, to_act
from shared.engine.state import GameState, Timing
from shared.engine.view import seat_table_view

TIMING = Timing(now=0.0)


def test_a_probe_changes_the_style_and_more_against_a_patient_opponent() -> None:
    base, waited = styles(Probe(style={"feed": 1.0}, waited={"wait_rounds": 6}))
    assert (base.feed, base.wait_rounds) == (1.0, luna.STYLE.wait_rounds)
    assert (waited.feed, waited.wait_rounds) == (1.0, 6)


@pytest.mark.parametrize(
    ("probe", "error"),
    [
        (Probe(style={"fed": 1.0}), "not fields of luna.Style: fed"),
        (Probe(waited={"rounds": 2}), "not fields of luna.Style: rounds"),
        (Probe(ceiling="everything"), "ceiling must be one of"),
        (Probe(ceiling="all", share=0.0), "share must be above 0 and at most 1"),
        (Probe(ceiling="all", share=1.5), "share must be above 0 and at most 1"),
    ],
)
def test_a_probe_with_an_unknown_field_or_ceiling_is_refused(probe: Probe, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        styles(probe)


SCRIPT = """
import json
from bench import luna_probe
from services.bots import tournament
result = tournament.run(
    ("bench.luna_probe:decide", "services.bots.strategies.simple:decide"), 2, 3, 1,
    progress=False,
)
print(json.dumps({"matches": result["matches"], "seen": luna_probe.seen_by_ceiling[0]}))
"""


@pytest.mark.parametrize(
    ("probe", "sees"),
    [
        ({"ceiling": None}, False),
        ({"ceiling": "all"}, True),
        ({"ceiling": "fed"}, True),
        ({"ceiling": "threat"}, True),
        ({"ceiling": "all", "share": 0.1}, True),
    ],
)
def test_only_a_ceiling_sees_the_opponents_hand(probe: dict[str, object], sees: bool) -> None:
    env = dict(os.environ, LUNA_PROBE=json.dumps(probe))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["matches"] == 2
    assert (result["seen"] > 0) is sees


def _a_discard_to_price() -> tuple[GameState, TableView]:
    """A hand dealt and played until a seat must discard (both pass the upcard; a stock draw)."""
    state, _ = new_game(TableOptions(), TIMING)
    state, _ = deal(state, list(range(52))[::-1], "probe", 0, TIMING)
    while True:
        seat = to_act(state)
        assert seat is not None
        assert state.hand is not None
        view = seat_table_view(
            state,
            seat,
            TIMING,
            table_id="probe",
            version=0,
            status=state.status,
            seats=[Player(name="a"), Player(name="b")],
            options=state.options,
        )
        if state.hand.phase == "discard":
            return state, view
        move = next(m for m in view.legal if isinstance(m, c.PassUpcard | c.Draw))
        state, _ = apply(state, seat, move, TIMING)


@pytest.mark.parametrize("part", ["fed", "threat"])
def test_a_split_ceiling_prices_only_its_part_with_the_real_hand(
    part: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, view = _a_discard_to_price()
    assert state.hand is not None
    assert view.you is not None
    real = state.hand.hands[1 - view.you]
    monkeypatch.setattr(luna_probe, "PROBE", Probe(ceiling=part))
    monkeypatch.setattr(luna_probe, "deciding", [state])
    mind = luna_probe.think(view, random.Random(1), luna_probe.STYLE)
    assert isinstance(mind, luna_probe.ProbeMind)
    priced: list[tuple[list[int], list[int]]] = []
    monkeypatch.setattr(
        luna, "price_discards", lambda _mind, _allowed, fed, threat: priced.append((fed, threat))
    )
    luna.discard_costs(mind, discardable(view))
    sampled = luna.Mind.opponents(mind, mind.style.feed_samples)
    seen = [real] * len(sampled)
    assert sampled != seen  # her own samples are not the real hand
    assert priced == [(seen, sampled) if part == "fed" else (sampled, seen)]
