"""Operations of the chat service: health, readiness, metrics, and running it as a process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from shared.infra.settings import Settings, env_name
from tests.chat.conftest import ChatApi, chat_table, person
from tests.e2e.processes import free_port
from tests.table.conftest import Api

ROOT = Path(__file__).resolve().parents[2]
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def metrics(chat: ChatApi) -> Metrics:
    async with chat.client.get("/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def messages_total(values: Metrics, outcome: str) -> float:
    return values.get(("gin_chat_messages_total", (("outcome", outcome),)), 0.0)


async def test_healthz_and_readyz(chat: ChatApi) -> None:
    reply = await chat.call("GET", "/healthz")
    assert (reply.status, reply.body) == (200, {"status": "ok"})
    reply = await chat.call("GET", "/readyz")
    assert reply.status == 200
    assert reply.body == {"status": "ready", "checks": {"postgresql": "ok", "rabbitmq": "ok"}}


async def test_metrics_count_messages_refusals_and_the_outbox(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    before = await metrics(chat)
    await chat.say(table_id, ana, "oi")
    assert (await chat.post(table_id, person(api, "Eve"), "oi")).status == 403
    assert (await chat.post(table_id, ana, " ")).status == 400
    after = await metrics(chat)
    for outcome, more in (("posted", 1), ("spectators_cannot_chat", 1), ("invalid_text", 1)):
        assert messages_total(after, outcome) == messages_total(before, outcome) + more
    names = {name for name, _ in after}
    assert {"gin_outbox_lag_seconds", "gin_outbox_published_total"} <= names
    assert ("gin_chat_table_events_total", (("outcome", "applied"), ("type", "seat_taken"))) in (
        after
    )


async def test_python_m_services_chat_serves_then_drains_on_sigterm(settings: Settings) -> None:
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            env_name("database_url"): settings.database_url,
            env_name("amqp_url"): settings.amqp_url,
            env_name("prefix"): settings.prefix,
            env_name("auth_secret"): settings.auth_secret,  # the default is refused at start
            env_name("http_port"): str(port),
            env_name("log_level"): "warning",
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.chat", cwd=ROOT, env=env
    )
    try:
        async with aiohttp.ClientSession() as session:
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                assert asyncio.get_running_loop().time() < deadline, "not ready in 20 s"
                await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
