"""The cost-of-tracing bench (issue 34, part 4) runs, at a small scale, and exports what it
says: nothing with tracing off, about one span in a hundred moves' at 1%, every move's at
100%. No timing is asserted (the figures belong to ``make bench``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_the_tracing_bench_runs_each_mode_and_exports_only_when_on() -> None:
    env = {
        **os.environ,
        "BENCH_ROUNDS": "1",
        "BENCH_SECONDS": "3",
        "BENCH_TRACING_MATCHES": "10",
        "BENCH_TRACING_SETTLE_S": "2",
    }
    run = subprocess.run(
        [sys.executable, "-m", "bench", "tracing"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    rounds = {line["mode"]: line for line in lines if line["bench"] == "tracing_round"}
    assert set(rounds) == {"off", "sampled_1pct", "sampled_100pct"}
    assert all(r["moves"] > 0 and r["refused"] == 0 for r in rounds.values())
    assert rounds["off"]["spans_exported_per_move"] == 0
    # Every move's request, statements, publishes and handlings: several spans a move.
    assert rounds["sampled_100pct"]["spans_exported_per_move"] >= 3
    assert rounds["sampled_1pct"]["spans_exported_per_move"] < 1
    cost = next(line for line in lines if line["bench"] == "tracing_cost")
    assert set(cost["over_off"]) == {"sampled_1pct", "sampled_100pct"}
