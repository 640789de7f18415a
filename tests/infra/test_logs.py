"""The log setup (issue 14, part 4): JSON lines from structlog and the standard library alike,
with the service's name; a storm of one warning (every request during an outage) is cut to a
few lines a second, each saying how many it stands for."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from shared.infra.logs import MalformedRequests, Throttle
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


MALFORMED = """
import asyncio, logging, socket
from aiohttp import web
from shared.infra.logs import configure
configure("json", "info", service="table")

async def main():
    app = web.Application()
    app.router.add_get("/", lambda request: web.Response(text="ok"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    for garbage in [b"GET / HTTP/1.1\\r\\nHost: x\\r\\nBad Header\\r\\n\\r\\n"] * 5 + [
        b"GET / HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: -1\\r\\n\\r\\n"
    ]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        await writer.drain()
        await reader.read()
        writer.close()
    await runner.cleanup()

asyncio.run(main())
"""


def test_malformed_requests_are_one_info_line_per_address_without_a_traceback() -> None:
    """Issue 31, part 7: aiohttp's ERROR with a traceback for each request it cannot parse
    is one INFO line, ``request_malformed``, at most once a minute per address."""
    done = subprocess.run(
        [sys.executable, "-c", MALFORMED], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    server = [e for e in lines if e.get("logger") == "aiohttp.server"]
    assert [e["event"] for e in server] == ["request_malformed"], server
    [malformed] = server
    assert malformed["level"] == "info"
    assert malformed["remote"] == "127.0.0.1"
    assert malformed["status"] == 400
    assert malformed["reason"]
    assert "exception" not in malformed
    assert not [e for e in lines if e["level"] in ("error", "critical")]


def test_the_malformed_request_filter_writes_each_address_once_a_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)  # a service at info (below it, the line is not written)
    now = [0.0]
    malformed = MalformedRequests(every_s=60.0, clock=lambda: now[0])

    def record(address: str, exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request from %s",
            (address,),
            (type(exc), exc, None),
        )

    first = record("10.0.0.1", BadHttpMessage("bad header"))
    assert malformed.filter(first) is True
    assert (first.levelno, first.msg, first.exc_info) == (logging.INFO, "request_malformed", None)
    assert malformed.filter(record("10.0.0.1", BadHttpMessage("again"))) is False
    assert malformed.filter(record("10.0.0.2", BadHttpMessage("another address"))) is True
    now[0] = 61.0
    later = record("10.0.0.1", BadHttpMessage("later"))
    assert malformed.filter(later) is True
    assert later.fields["suppressed"] == 1  # type: ignore[attr-defined]
    ours = record("10.0.0.1", ZeroDivisionError("a bug of ours"))
    assert malformed.filter(ours) is True
    assert (ours.levelno, ours.exc_info is not None) == (logging.ERROR, True)  # unchanged
