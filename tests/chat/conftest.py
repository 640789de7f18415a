"""The real chat service and the real table service, in-process, against this run's servers.

Both use the session's settings: the same database (schemas ``gin_chat`` and ``gin_table``)
and the same broker prefix, so the chat learns who sits where from the table's real events and
the table's WebSocket delivers the chat's real messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

import aio_pika
import asyncpg
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from services.chat.app import SCHEMA, create_app
from services.chat.consumer import CHAT_QUEUE
from shared.infra.settings import Settings
from tests.serving import ProductionServer
from tests.table.conftest import Api, Clock, open_api


class Reply(NamedTuple):
    """An HTTP answer: status, decoded JSON body, headers."""

    status: int
    body: Any
    headers: dict[str, str]


class ChatApi:
    """A thin client of the chat service for tests."""

    def __init__(self, client: TestClient[web.Request, web.Application], clock: Clock) -> None:
        self.client = client
        self.clock = clock

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        body: Any = None,
        raw: bytes | None = None,
    ) -> Reply:
        data = raw if raw is not None else (None if body is None else msgspec.json.encode(body))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.client.request(method, path, data=data, headers=headers) as r:
            text = await r.read()
            return Reply(r.status, msgspec.json.decode(text) if text else None, dict(r.headers))

    async def post(self, table_id: str, token: str | None, text: str) -> Reply:
        return await self.call("POST", f"/v1/tables/{table_id}/messages", token, {"text": text})

    async def say(self, table_id: str, token: str, text: str) -> dict[str, Any]:
        """Post a message that must be accepted; its envelope."""
        reply = await self.post(table_id, token, text)
        assert reply.status == 201, reply
        return reply.body  # type: ignore[no-any-return]

    async def history(
        self, table_id: str, after: int | None = None, limit: int | None = None
    ) -> Reply:
        query = "&".join(
            f"{name}={value}"
            for name, value in (("after", after), ("limit", limit))
            if value is not None
        )
        return await self.call("GET", f"/v1/tables/{table_id}/messages?{query}")

    async def all_messages(self, table_id: str) -> list[dict[str, Any]]:
        """Every message of a table, page by page."""
        out: list[dict[str, Any]] = []
        while True:
            reply = await self.history(table_id, after=out[-1]["seq"] if out else 0)
            assert reply.status == 200, reply
            if not reply.body:
                return out
            out += reply.body


@contextlib.asynccontextmanager
async def open_chat(settings: Settings, clock: Clock | None = None) -> AsyncIterator[ChatApi]:
    """A chat service instance with its client; closed (drained) on exit."""
    clock = clock or Clock()
    async with TestClient(ProductionServer(create_app(settings, clock=clock))) as client:
        yield ChatApi(client, clock)


@pytest.fixture
async def chat(settings: Settings) -> AsyncIterator[ChatApi]:
    async with open_chat(settings) as chat:
        yield chat


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    """The table service (its own clock)."""
    async with open_api(settings) as api:
        yield api


@pytest.fixture
async def chat_db(settings: Settings, chat: ChatApi) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the chat's schema (the app migrated it)."""
    conn = await asyncpg.connect(settings.database_url, server_settings={"search_path": SCHEMA})
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture(scope="package", autouse=True)
def _delete_the_chat_queue(settings: Settings) -> Iterator[None]:
    """The chat's durable queue is the run's too: deleted after these tests."""
    yield

    async def delete() -> None:
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(settings.prefix + CHAT_QUEUE)

    asyncio.run(delete())


async def learned(
    chat_db: asyncpg.Connection, table_id: str, seats: int = 2, within_s: float = 10.0
) -> None:
    """Wait until the chat has learned ``seats`` seats of a table from its events."""
    deadline = asyncio.get_running_loop().time() + within_s
    while (
        await chat_db.fetchval("SELECT count(*) FROM seats WHERE table_id = $1", table_id) < seats
    ):
        assert asyncio.get_running_loop().time() < deadline, f"the chat did not learn {table_id}"
        await asyncio.sleep(0.02)


async def status_becomes(
    chat_db: asyncpg.Connection, table_id: str, status: str, within_s: float = 10.0
) -> None:
    """Wait until the chat has learned that a table closed or expired."""
    deadline = asyncio.get_running_loop().time() + within_s
    while await chat_db.fetchval("SELECT status FROM tables WHERE table_id = $1", table_id) != (
        status
    ):
        assert asyncio.get_running_loop().time() < deadline, f"{table_id} is not {status}"
        await asyncio.sleep(0.02)


def person(api: Api, name: str) -> str:
    """A token of a new person: the rate limit counts a player's messages at every table, so
    each test's players are its own."""
    return api.token(name, sub=f"{name.lower()}-{uuid.uuid4().hex[:12]}")


async def chat_table(api: Api, chat_db: asyncpg.Connection) -> tuple[str, str, str]:
    """A table with two people seated, known to the chat: (table_id, Ana's, Bia's token)."""
    ana, bia = person(api, "Ana"), person(api, "Bia")
    created = await api.create(ana)
    table_id = created["table_id"]
    status, body = await api.call(
        "POST", f"/v1/tables/{table_id}/join", bia, {"invite_code": created["invite_code"]}
    )
    assert status == 200, body
    await learned(chat_db, table_id)
    return table_id, ana, bia
