"""The real timer service (and the real table service) against this run's servers.

Every test of a server (``clean_timers``) starts from an empty ``gin_timers`` schema, and with
the deadlines of tables made before it cleared, so the deadlines of one test never fire in
another (they share the run's database and prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from services.table.app import migrate as migrate_table
from services.timers.app import create_app, migrate
from services.timers.store import TIMER_DEADLINES
from shared.contracts.names import COMMANDS_EXCHANGE
from shared.infra.settings import Settings
from tests.e2e.processes import free_port
from tests.serving import ProductionServer
from tests.table.conftest import Api

ROOT = Path(__file__).resolve().parents[2]


def timing(settings: Settings, absence_s: float, expiry_s: float, **more: Any) -> Settings:
    """The run's settings with short absence and expiry times and a quick firing loop (and no
    turn reminders unless ``turn_reminders_s`` says: the default offsets are longer than a
    test's absence time)."""
    changes: dict[str, Any] = {
        "timer_poll_s": 0.1,
        "relay_poll_s": 0.1,
        "turn_reminders_s": "",
        **more,
    }
    return msgspec.structs.replace(
        settings, absence_after_s=absence_s, expiry_after_s=expiry_s, **changes
    )


@pytest.fixture
async def clean_timers(settings: Settings) -> None:
    """An empty timer schema, and no deadline of an earlier test's table left to fire."""
    await migrate_table(settings)
    await migrate(settings)
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute(
            "TRUNCATE gin_timers.fired, gin_timers.announcements, gin_timers.outbox;"
            " UPDATE gin_timers.scans SET scanned_to = 'epoch';"
            " UPDATE gin_table.deadlines SET absence_seat = NULL, absence_since = NULL,"
            " absence_seq = NULL, expiry_since = NULL, expiry_seq = NULL, backfill = false"
            " WHERE expiry_since IS NOT NULL OR backfill"
        )
    finally:
        await conn.close()


Row = tuple[str, int | None, datetime | None, int | None, datetime | None, int | None]


@pytest.fixture
async def synthetic(settings: Settings) -> AsyncIterator[str]:
    """A prefix for table ids whose deadlines a test writes straight into
    ``gin_table.deadlines`` (no such table exists); their rows are deleted afterwards."""
    prefix = f"syn-{uuid.uuid4().hex[:8]}-"
    yield prefix
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.execute("DELETE FROM gin_table.deadlines WHERE table_id LIKE $1", prefix + "%")
    finally:
        await conn.close()


async def put_deadlines(conn: asyncpg.Connection, rows: list[Row]) -> None:
    """Write deadlines as the table service's save does: (table_id, absence_seat,
    absence_since, absence_seq, expiry_since, expiry_seq) per row."""
    await conn.executemany(
        "INSERT INTO gin_table.deadlines AS d (table_id, absence_seat, absence_since,"
        " absence_seq, expiry_since, expiry_seq) VALUES ($1, $2, $3, $4, $5, $6)"
        " ON CONFLICT (table_id) DO UPDATE SET absence_seat = $2, absence_since = $3,"
        " absence_seq = $4, expiry_since = $5, expiry_seq = $6, backfill = false",
        rows,
    )


@contextlib.asynccontextmanager
async def open_timers(
    settings: Settings, clock: Callable[[], float] = time.time
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The real timer service in this process, with its HTTP client."""
    async with TestClient(ProductionServer(create_app(settings, clock=clock))) as client:
        yield client


@pytest.fixture
async def tdb(settings: Settings) -> AsyncIterator[TimerDb]:
    conn = await asyncpg.connect(
        settings.database_url, server_settings={"search_path": "gin_timers"}
    )
    try:
        yield TimerDb(conn)
    finally:
        await conn.close()


class TimerDb:
    """Reads of the timer service's own schema and of the deadlines it reads, for assertions."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def deadlines(self, table_id: str) -> dict[str, dict[str, Any]]:
        """The table's deadlines as the timer service reads them: {kind: {seat, since, seq}}."""
        row = await self.conn.fetchrow(
            f"SELECT * FROM {TIMER_DEADLINES} WHERE table_id = $1", table_id
        )
        if row is None:
            return {}
        found = {}
        for kind in ("absence", "expiry"):
            if row[f"{kind}_since"] is not None:
                found[kind] = {
                    "seat": row["absence_seat"] if kind == "absence" else None,
                    "since": row[f"{kind}_since"],
                    "seq": row[f"{kind}_seq"],
                }
        return found

    async def fired(self, table_id: str) -> dict[str, asyncpg.Record]:
        """What the timer service fired of the table's deadlines, by kind."""
        rows = await self.conn.fetch("SELECT * FROM fired WHERE table_id = $1", table_id)
        return {row["kind"]: row for row in rows}

    async def expire_commands(self, table_id: str) -> list[dict[str, Any]]:
        """The expire commands the service sent for a table (its outbox rows)."""
        rows = await self.conn.fetch(
            "SELECT body, published_at FROM outbox WHERE exchange = $1 ORDER BY id",
            COMMANDS_EXCHANGE,
        )
        bodies = [dict(msgspec.json.decode(r["body"]), published=r["published_at"]) for r in rows]
        return [b for b in bodies if b["table_id"] == table_id]


async def until_status(api: Api, table_id: str, status: str, within_s: float = 10.0) -> Any:
    """The public view of a table once it has that status."""
    deadline = time.monotonic() + within_s
    while (view := await api.view(table_id))["status"] != status:
        assert time.monotonic() < deadline, f"{table_id} is still {view['status']}"
        await asyncio.sleep(0.05)
    return view


def parse_time(text: str) -> float:
    """An RFC 3339 time of the API as a clock reading."""
    return datetime.fromisoformat(text).timestamp()


async def metrics_of(
    client: TestClient[web.Request, web.Application], url: str = "/metrics"
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a /metrics page: {(name, sorted labels): value}."""
    async with client.get(url) as r:
        assert r.status == 200
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class TimerProcess:
    """``python -m services.timers`` as a process, configured only through GIN_* variables."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, within_s: float = 30.0) -> None:
        s = self.settings
        env = {
            **os.environ,
            "GIN_DATABASE_URL": s.database_url,
            "GIN_AMQP_URL": s.amqp_url,
            "GIN_PREFIX": s.prefix,
            "GIN_HTTP_PORT": str(self.port),
            "GIN_ABSENCE_AFTER_S": str(s.absence_after_s),
            "GIN_EXPIRY_AFTER_S": str(s.expiry_after_s),
            "GIN_TURN_REMINDERS_S": s.turn_reminders_s,
            "GIN_TIMER_POLL_S": str(s.timer_poll_s),
            "GIN_TIMER_BATCH": str(s.timer_batch),
            "GIN_RELAY_POLL_S": str(s.relay_poll_s),
            "GIN_LOG_FORMAT": "json",
            "GIN_LOG_LEVEL": "info",
            "GIN_SHUTDOWN_GRACE_S": "5",
        }
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.timers",
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + within_s
        async with aiohttp.ClientSession() as session:
            while True:
                assert self.proc.returncode is None, self.output()
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.url + "/readyz") as r:
                        if r.status == 200:
                            return
                assert time.monotonic() < deadline, "the timer service was not ready in time"
                await asyncio.sleep(0.1)

    async def stop(self) -> int:
        """SIGTERM, and wait for a clean exit; the exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise

    async def kill(self) -> int:
        """SIGKILL: no shutdown of any kind (its open transaction is left to the database)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return await asyncio.wait_for(self.proc.wait(), 15)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def logged(self, event: str) -> list[dict[str, Any]]:
        """The JSON log lines of one event name."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(msgspec.DecodeError):
                record = msgspec.json.decode(line)
                if isinstance(record, dict) and record.get("event") == event:
                    out.append(record)
        return out
