"""PostgreSQL shut down mid-match, fast (what a CloudNativePG switchover or a rolling restart
does) and then by a crash (immediate), under every service running as a process (issue 14,
part 3). While it is down, HTTP answers 503 with Retry-After and the error body, never 500
nor a hang, and /readyz says so at once; once it is back, everything resumes by itself: the
person's retried commands apply once, the bot moves again, no message was dead-lettered, no
acknowledged move is missing from the table's log, and every log line was JSON.

Runs against a throwaway PostgreSQL of its own (``scripts/servers.py``), never the machine's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiohttp
import msgspec
import pytest

from shared.contracts.names import DEAD_LETTER
from shared.infra import amqp
from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.e2e.processes import Service
from tests.moves import sobra_move
from tests.tcp_proxy import Proxy, through

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import servers  # noqa: E402

pytestmark = pytest.mark.slow
OUTAGE_S = 6.0
SERVICES = ("table", "chat", "timers", "bots")


class Postgres:
    """A throwaway PostgreSQL the test shuts down and starts again (same port, same data)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.owner = servers.owner_of(state_dir)
        self.entry = self.start()

    def start(self) -> servers.PgState:
        self.entry = servers.start_postgres(
            self.state_dir, servers.load_state(self.state_dir), servers.Installer(), 120
        )
        return self.entry

    def restart(self) -> None:
        """Start the stopped server again on its data and its port (``start_postgres`` would
        take another port while the old one lingers in TIME_WAIT)."""
        entry = self.entry
        env = servers.pg_env()
        env.pop("PGCONNECT_TIMEOUT", None)
        env[servers.OWNER_ENV] = self.owner
        pg_ctl = servers.pg_bindir(servers.Installer()) / "pg_ctl"
        log_file = Path(entry.root) / "log" / "postgres.log"
        argv = [str(pg_ctl), "-D", entry.data_dir, "-l", str(log_file), "-w", "-t", "60", "start"]
        result = servers.run(
            servers.as_user(entry.os_user, argv), env=env, cwd=Path(entry.root), timeout=70
        )
        assert result.returncode == 0, servers.output_of(result)
        entry.pid = servers.read_postmaster_pid(Path(entry.data_dir))

    def stop(self, how: signal.Signals) -> None:
        """SIGINT: a fast shutdown (sessions terminated, 57P01); SIGQUIT: immediate (a crash:
        no checkpoint, recovery at the next start)."""
        pid = servers.pg_owned_pid(self.entry, self.owner)
        assert pid is not None
        servers.send_signal(pid, how)
        assert servers.wait_gone([pid], 60)

    def close(self) -> None:
        servers.stop_postgres(self.entry, self.owner)


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    pg = Postgres(tmp_path_factory.mktemp("postgres"))
    # The throwaway server trades durability for speed (synchronous_commit off), and a crash
    # then loses commits already acknowledged: production's setting (on) for this test.
    conf = Path(pg.entry.data_dir) / "postgresql.conf"
    conf.write_text(conf.read_text() + "\nsynchronous_commit = on\n")
    pg.stop(signal.SIGINT)
    pg.restart()
    try:
        yield pg
    finally:
        pg.close()


class Person:
    """A scripted player over HTTP who retries what the service asks to retry."""

    def __init__(self, session: aiohttp.ClientSession, base: str, token: str) -> None:
        self.session = session
        self.base = base
        self.token = token
        self.answers: list[tuple[int, str | None, Any]] = []  # status, Retry-After, body
        self.acknowledged: dict[str, int] = {}  # command ids answered 200: the version after

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request, retried while it answers 503 (after its Retry-After)."""
        while True:
            async with asyncio.timeout(10):  # never a hang
                async with self.session.request(
                    method,
                    self.base + path,
                    json=body,
                    headers={"Authorization": f"Bearer {self.token}"},
                ) as r:
                    text = await r.text()
                    answer = json.loads(text) if text else None
                    self.answers.append((r.status, r.headers.get("Retry-After"), answer))
            if r.status != 503:
                return r.status, answer
            await asyncio.sleep(min(float(r.headers.get("Retry-After", "1")), 0.5))

    async def move(self, table_id: str) -> dict[str, Any]:
        """Wait for the person's turn (the bot plays its own), then play one move."""
        while True:
            status, view = await self.call("GET", f"/v1/tables/{table_id}")
            assert status == 200, view
            if view["status"] != "playing" or view["hand"]["to_act"] == 0:
                break
            await asyncio.sleep(0.05)
        if view["status"] != "playing":
            return view
        move = sobra_move(view)
        command_id = f"p-{uuid.uuid4().hex[:12]}"
        status, body = await self.call(
            "POST", f"/v1/tables/{table_id}/commands", {**move, "command_id": command_id}
        )
        assert status == 200, body
        self.acknowledged[command_id] = body["version"]
        return view


async def metric_total(session: aiohttp.ClientSession, base: str, name: str) -> float:
    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def metric_lines(session: aiohttp.ClientSession, base: str, prefix: str) -> list[str]:
    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    return [line for line in text.splitlines() if line.startswith(prefix)]


async def readiness(session: aiohttp.ClientSession, base: str) -> tuple[int, dict, float]:
    started = time.monotonic()
    async with session.get(f"{base}/readyz") as r:
        body = await r.json()
    return r.status, body, time.monotonic() - started


async def bot_moves(session: aiohttp.ClientSession, base: str, table_id: str) -> int:
    async with session.get(f"{base}/v1/tables/{table_id}/events?after=0") as r:
        events = await r.json()
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), "the table's log has a gap"
    return sum(1 for e in events if e["data"].get("seat") == 1 and e["type"] != "seat_taken")


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGQUIT], ids=["fast", "immediate"])
async def test_postgresql_down_mid_match_answers_503_and_loses_nothing(
    postgres: Postgres, settings: Settings, tmp_path: Path, how: signal.Signals
) -> None:
    prefix = f"{settings.prefix}pgout-{how.name.lower()}."
    s = msgspec.structs.replace(
        settings,
        database_url=postgres.entry.url,
        prefix=prefix,
        log_format="json",
        bot_think_s=0.0,
        bot_turn_resend_s=3.0,
        db_acquire_timeout_s=1.0,
    )
    logs = {name: tmp_path / f"{name}.log" for name in SERVICES}
    services = {
        name: Service(f"services.{name}", s, log_to=logs[name], GIN_LOG_LEVEL="info")
        for name in SERVICES
    }
    try:
        for service in services.values():
            await service.ready(within_s=60)
        base = services["table"].base
        async with aiohttp.ClientSession() as session:
            person = Person(session, base, mint(s.auth_secret, f"ana-{uuid.uuid4().hex}", "Ana"))
            status, created = await person.call("POST", "/v1/tables", {})
            assert status == 201, created
            table_id = created["table_id"]
            status, body = await person.call(
                "POST", f"/v1/tables/{table_id}/bot", {"level": "tito"}
            )
            assert status == 200, body
            for _ in range(6):
                await person.move(table_id)
            before = await bot_moves(session, base, table_id)
            assert before >= 3

            await asyncio.to_thread(postgres.stop, how)
            down_at = time.monotonic()
            playing = asyncio.create_task(person.move(table_id))  # waits out the outage
            seen_unready = False
            while time.monotonic() - down_at < OUTAGE_S:
                status, body, took = await readiness(session, base)
                assert took < 3.0, "readiness hung"
                if status == 503 and body["checks"]["postgresql"].startswith("failing"):
                    seen_unready = True
                await asyncio.sleep(0.5)
            assert seen_unready, "readiness never reported the database"
            assert not playing.done() or playing.exception() is None
            refused = [a for a in person.answers if a[0] == 503]
            assert refused, "no request met the outage"
            for _, retry_after, body in refused:
                assert retry_after is not None
                assert int(retry_after) >= 1
                assert body["error"]["code"] in ("database_unavailable", "busy"), body

            await asyncio.to_thread(postgres.restart)
            async with asyncio.timeout(60):
                await playing
                for _ in range(6):
                    view = await person.move(table_id)
                    if view["status"] != "playing":
                        break
            async with asyncio.timeout(30):
                while await bot_moves(session, base, table_id) < before + 3:
                    await asyncio.sleep(0.2)
            for name in SERVICES:
                status, body, _ = await readiness(session, services[name].base)
                assert status == 200, (name, body)
            assert [a for a in person.answers if a[0] >= 500 and a[0] != 503] == []
            for name in SERVICES:
                dead = await metric_total(session, services[name].base, "gin_dead_lettered_total")
                assert dead == 0, f"{name} dead-lettered {dead} messages"
            for name in SERVICES:
                served = await metric_lines(session, services[name].base, "gin_http_responses")
                assert served, name
                assert not [line for line in served if 'status="5' in line and '"503"' not in line]
            # every acknowledged command is in the table's log (its version, its seat's move)
            async with session.get(f"{base}/v1/tables/{table_id}/events?after=0") as r:
                events = await r.json()
            logged = {e["version"] for e in events if e["data"].get("seat", 0) == 0}
            missing = {c: v for c, v in person.acknowledged.items() if v not in logged}
            assert not missing, f"acknowledged, then lost: {missing}"
            assert len(set(person.acknowledged.values())) == len(person.acknowledged)
    finally:
        for service in services.values():
            service.terminate()
        for service in services.values():
            service.stop()
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            channel = await connection.channel()
            dead = await channel.declare_queue(prefix + DEAD_LETTER, passive=True)
            waiting = dead.declaration_result.message_count
            await amqp.delete_topology(channel, prefix)
            await channel.queue_delete(prefix + "gin.chat")
    assert waiting == 0, f"{waiting} messages in {prefix}{DEAD_LETTER}"
    for name, path in logs.items():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            try:
                assert isinstance(json.loads(line), dict)
            except ValueError:
                raise AssertionError(f"{name}.log line {number}: {line[:300]!r}") from None


async def test_a_service_started_during_an_outage_waits_for_it_and_starts(
    postgres: Postgres, settings: Settings, tmp_path: Path
) -> None:
    """A pod restarted while PostgreSQL or RabbitMQ is down waits for them (within its
    startupProbe) instead of exiting into a restart loop whose back-off outlasts the outage."""
    node = amqp.node_urls(settings.amqp_url)[0]  # a cluster's first node: through the proxy
    amqp_url = urlsplit(node)
    broker = Proxy(amqp_url.hostname or "127.0.0.1", amqp_url.port or 5672)
    await broker.start()
    await broker.cut()  # nothing listens on its port now
    s = msgspec.structs.replace(
        settings,
        database_url=postgres.entry.url,
        amqp_url=through(node, broker.port),
        prefix=f"{settings.prefix}pgwait.",
        log_format="json",
    )
    await asyncio.to_thread(postgres.stop, signal.SIGINT)
    chat = Service("services.chat", s, log_to=tmp_path / "chat.log", GIN_LOG_LEVEL="info")
    try:
        await asyncio.sleep(3.0)
        assert chat.proc.poll() is None, "it exited instead of waiting"
        await asyncio.to_thread(postgres.restart)
        await asyncio.sleep(3.0)
        assert chat.proc.poll() is None, "it exited instead of waiting for the broker"
        await broker.start()
        await chat.ready(within_s=30)
    finally:
        chat.stop()
        await broker.cut()
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            channel = await connection.channel()
            await amqp.delete_topology(channel, s.prefix)
            await channel.queue_delete(s.prefix + "gin.chat")
    events = [
        json.loads(line)["event"] for line in (tmp_path / "chat.log").read_text().splitlines()
    ]
    assert "waiting_for_database" in events
    assert "waiting_for_broker" in events
