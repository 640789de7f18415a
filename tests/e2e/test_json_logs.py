"""With GIN_LOG_FORMAT=json every line every service writes is one JSON object (issue 14, part
4): the services run as processes, their stdout and stderr kept, while their database
sessions are killed and their broker connection cut and restored; then every line must parse
as a JSON object naming its service, and the lines of aiohttp, aio-pika and tracebacks must
be among them."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import msgspec
import pytest

from shared.infra.amqp import node_urls
from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.e2e.processes import Service
from tests.tcp_proxy import Proxy, through

pytestmark = pytest.mark.slow
NAMES = {"table": "services.table", "chat": "services.chat", "timers": "services.timers"}


async def request(
    session: aiohttp.ClientSession, method: str, url: str, token: str | None = None, **kw: Any
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.request(method, url, headers=headers, **kw) as r:
        text = await r.text()
        return r.status, (json.loads(text) if text.startswith("{") else text)


def raw_garbage(port: int) -> None:
    """A request line no HTTP parser takes: aiohttp's own error path."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"\x16\x03\x01 GARBAGE\r\n\r\n")
        s.settimeout(5)
        s.recv(4096)


def lines_of(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8", errors="replace").splitlines()


async def test_every_line_every_service_writes_is_one_json_object(
    settings: Settings, tmp_path: Path
) -> None:
    node = node_urls(settings.amqp_url)[0]  # a cluster's first node: through the proxy
    amqp = urlsplit(node)
    broker = Proxy(amqp.hostname or "127.0.0.1", amqp.port or 5672)
    await broker.start()
    s = msgspec.structs.replace(
        settings,
        amqp_url=through(node, broker.port),
        log_format="json",
        access_log=True,
    )
    logs = {name: tmp_path / f"{name}.log" for name in [*NAMES, "bots"]}
    services = {
        name: Service(module, s, log_to=logs[name], GIN_LOG_LEVEL="info")
        for name, module in NAMES.items()
    }
    services["bots"] = Service("services.bots", s, log_to=logs["bots"], GIN_LOG_LEVEL="info")
    admin = await asyncpg.connect(settings.database_url)
    try:
        for service in services.values():
            await service.ready()
        base = services["table"].base
        token = mint(s.auth_secret, "json-logs-ana", "Ana")
        async with aiohttp.ClientSession() as session:
            assert (await request(session, "GET", f"{base}/nope"))[0] == 404
            status, created = await request(session, "POST", f"{base}/v1/tables", token, json={})
            assert status == 201, created
            table = created["table_id"]
            await request(
                session, "POST", f"{base}/v1/tables/{table}/bot", token, json={"level": "tito"}
            )
            await request(session, "POST", f"{base}/v1/tables/{table}/commands", token, data=b"{")
            await asyncio.to_thread(raw_garbage, services["table"].port)
            # every session of the services killed, as a fast PostgreSQL shutdown does
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE 'gin-%'"
            )
            assert killed >= 3
            for _ in range(3):
                await request(session, "GET", f"{base}/v1/tables/{table}", token)
                await request(session, "GET", f"{base}/readyz")
            await broker.cut()  # RabbitMQ unreachable for all four
            await asyncio.sleep(3.0)
            status, body = await request(session, "GET", f"{base}/readyz")
            assert status == 503, body
            assert body["checks"]["rabbitmq"].startswith("failing"), body
            await broker.start()
            for service in services.values():
                await service.ready(within_s=30)
    finally:
        for service in services.values():
            service.terminate()
        for service in services.values():
            service.stop()
        await admin.close()
        await broker.cut()

    loggers: set[str] = set()
    tracebacks = 0
    with_table = 0
    for name, path in logs.items():
        lines = lines_of(path)
        assert lines, f"{name} wrote nothing"
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
            except ValueError:
                raise AssertionError(
                    f"{name}.log line {number} is not JSON: {line[:300]!r}"
                ) from None
            assert isinstance(entry, dict), (name, number, line)
            assert entry.get("service") == name, (name, number, line)
            assert {"event", "level", "timestamp"} <= set(entry), (name, number, line)
            loggers.add(entry.get("logger", ""))
            tracebacks += "Traceback" in str(entry.get("exception", ""))
            with_table += entry.get("table_id") == table
    assert "aiohttp.access" in loggers, loggers
    assert loggers & {"aio_pika.robust_connection", "aio_pika.connection", "aiormq.connection"}, (
        loggers
    )
    assert tracebacks >= 1
    assert with_table >= 1
