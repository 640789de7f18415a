"""The bots group of ``make bench`` (issue 35): a line per pairing with its goals and times.

Run on a handful of matches (the figures themselves come from the 2,000-match run): what is
checked is that every pairing the issue names is reported, with the share it is held to, its
paired 95% interval, and the first strategy's decision times beside the time goals.
"""

from __future__ import annotations

import json

import pytest

from bench import bots

# issue 35: (first strategy, the short name of the second, the share the first must win)
GOALS = {
    ("luna", "simple"): 0.78,
    ("luna", "gin_hunter"): 0.60,
    ("luna", "carmen"): 0.75,
    ("carmen", "tito"): 0.75,
}


def test_every_pairing_is_reported_with_its_goals_interval_and_times(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BENCH_BOTS_MATCHES", "4")
    monkeypatch.setenv("BENCH_BOTS_SEED", "3")
    monkeypatch.setenv("BENCH_BOTS_WORKERS", "1")
    bots.main()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    reported = {}
    for line in lines:
        a, b = line["bench"].removeprefix("bots_").split("_vs_")
        reported[(a, b)] = line
        assert line["matches"] == 4
        assert (line["seed"], line["workers"]) == (3, 1)
        low, high = line["ci95"]
        assert 0.0 <= low <= line["win_rate"] <= high <= 1.0
        assert line["design_effect"] >= 0.0
        assert line["decision_goal_ms"] == {"p99": 100.0, "max": 300.0}
        for times in (line["decision_ms"], line["decision_cpu_ms"]):
            assert set(times) == {a, b}
            mine = times[a]
            assert 0.0 < mine["p50"] <= mine["p99"] <= mine["max"]
            assert mine["n"] > 0
    assert {pair: line["goal"] for pair, line in reported.items()} == GOALS
