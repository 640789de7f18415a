"""The LUNA probes of ``bench/luna_probe.py``: their styles, and a ceiling that sees the hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.luna_probe import Probe, styles
from services.bots.strategies import luna


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


@pytest.mark.parametrize(("ceiling", "sees"), [(None, False), ("all", True)])
def test_only_a_ceiling_sees_the_opponents_hand(ceiling: str | None, sees: bool) -> None:
    env = dict(os.environ, LUNA_PROBE=json.dumps({"ceiling": ceiling}))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["matches"] == 2
    assert (result["seen"] > 0) is sees
