"""The whole-backend bench (issue 29) runs, at a small scale, and what it checks besides its
figures holds: every service answered, no absence was announced for a seat that was moving,
every queue and outbox drained. No figure is asserted (timings belong to ``make bench``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_the_backend_bench_plays_every_service_and_drains_every_queue() -> None:
    env = {
        **os.environ,
        "BENCH_ROUNDS": "1",
        # Twice the bench's 3 s absence: a deadline counts when it falls due within the round,
        # so a round as short as the absence counts only decisions given before it began,
        # which a loaded machine may not have given yet.
        "BENCH_SECONDS": "6",
        "BENCH_RAW_SECONDS": "1",
        "BENCH_MATCHES": "20",
        "BENCH_ABSENT_MATCHES": "4",
    }
    run = subprocess.run(
        [sys.executable, "-m", "bench", "backend"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    [played] = [line for line in lines if line["bench"] == "backend_round"]
    [goals] = [line for line in lines if line["bench"] == "backend_goals"]
    assert played["moves"] > 0
    assert played["refused"] == 0
    assert played["saturated_claims"] == 0  # no absence announced for a seat that moved
    assert played["deadlines"] > 0, "no absent seat was announced"
    assert played["drained"] is True
    parts = played["cpu_ms_per_move"]
    assert {"table", "relay", "timers", "chat", "bots", "postgres", "rabbitmq"} <= set(parts)
    assert all(parts[p] > 0 for p in ("table", "relay", "postgres", "rabbitmq"))
    queues = played["queues"]
    assert any(name.endswith("gin.commands") for name in queues)
    assert not any(name.endswith("gin.timers") for name in queues)  # no per-move timer work
    assert goals["timers_per_move"]["met"] is True
