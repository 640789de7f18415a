"""The log setup (issue 14, part 4): JSON lines from structlog and the standard library alike,
with the service's name; a storm of one warning (every request during an outage) is cut to a
few lines a second, each saying how many it stands for."""

from __future__ import annotations

import json
import subprocess
import sys

from shared.infra.logs import Throttle
from tests.e2e.processes import ROOT

STORM = """
import logging, structlog
from shared.infra.logs import configure
configure("json", "info", service="table")
log = structlog.get_logger()
for i in range(100):
    log.warning("database_unavailable", attempt=i)
    logging.getLogger("asyncpg.pool").warning("Failed to restore the pool floor %s", i)
log.info("still_here")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("aiohttp.server").exception("Error handling request")
import warnings
warnings.warn("a library's warning")
raise RuntimeError("the end")
"""


def test_a_storm_of_one_warning_is_a_few_json_lines() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STORM], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines()]
    assert all(entry["service"] == "table" for entry in lines)
    ours = [e for e in lines if e["event"] == "database_unavailable"]
    theirs = [e for e in lines if e.get("logger") == "asyncpg.pool"]
    assert 10 <= len(ours) < 30  # ten a second: the loop may straddle a second or two
    assert 10 <= len(theirs) < 30
    assert theirs[0]["event"] == "Failed to restore the pool floor 0"
    assert [e["event"] for e in lines if e["level"] == "info"] == ["still_here"]
    failed = next(e for e in lines if e.get("logger") == "aiohttp.server")
    assert "ZeroDivisionError" in failed["exception"]
    assert any(e.get("logger") == "py.warnings" for e in lines)
    assert "RuntimeError: the end" in lines[-1]["exception"]
    assert lines[-1]["event"] == "uncaught_exception"


def test_the_throttle_counts_what_it_drops() -> None:
    now = [100.0]
    throttle = Throttle(per_s=3, clock=lambda: now[0])
    assert [throttle.passes("x") for _ in range(5)] == [(True, 0)] * 3 + [(False, 0)] * 2
    assert throttle.passes("y") == (True, 0)  # another event has its own count
    now[0] += 1.0
    assert throttle.passes("x") == (True, 2)  # the next line says how many were dropped
    assert throttle.passes("x") == (True, 0)
