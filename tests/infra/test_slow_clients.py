"""Slow clients (issue 31, part 2): a request whose body never arrives whole answers 408 within
``GIN_BODY_READ_S`` and its connection is closed, at the table service and at the chat, so a
client cannot hold a connection and a handler for as long as it likes; a body that arrives in
time is served as before."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.chat.conftest import open_chat
from tests.table.conftest import open_api

DEADLINE_S = 0.5


async def send_slowly(
    server: Any, path: str, token: str, body: bytes, sent: int, close: bool = False
) -> tuple[int, Any, bool, float]:
    """POST ``path`` announcing ``body`` whole but sending only its first ``sent`` bytes; the
    status, the decoded answer, whether the server closed the connection after it, and the
    seconds it took (``close``: the client asks for the close, as a keep-alive would wait)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    began = time.monotonic()
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + ("Connection: close\r\n" if close else "")
            + "\r\n"
        )
        writer.write(head.encode() + body[:sent])
        await writer.drain()
        fields = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        status = int(fields.split(b"\r\n", 1)[0].split()[1])
        lines = [line.lower() for line in fields.split(b"\r\n")]
        length = next(int(x.partition(b":")[2]) for x in lines if x.startswith(b"content-length:"))
        answer = msgspec.json.decode(await reader.readexactly(length))
        closed = await asyncio.wait_for(reader.read(), timeout=5) == b""
        return status, answer, closed, time.monotonic() - began
    finally:
        writer.close()


@pytest.fixture
def quick(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, body_read_s=DEADLINE_S)


async def test_the_table_answers_408_to_a_body_that_never_arrives_and_closes(
    quick: Settings,
) -> None:
    async with open_api(quick) as api:
        token = api.token("Ana")
        body = msgspec.json.encode({"options": {}})
        status, answer, closed, took = await send_slowly(
            api.client.server, "/v1/tables", token, body, 3
        )
        assert status == 408
        assert answer["error"]["code"] == "request_timeout"
        assert closed, "the connection stays open after a 408"
        assert took >= DEADLINE_S
        # the whole body in time: served as always
        status, answer, _, _ = await send_slowly(
            api.client.server, "/v1/tables", token, body, len(body), close=True
        )
        assert status == 201, answer


async def test_the_chat_answers_408_to_a_body_that_never_arrives_and_closes(
    quick: Settings,
) -> None:
    async with open_chat(quick) as chat:
        token = mint(quick.auth_secret, "ana-slow", "Ana")
        body = msgspec.json.encode({"text": "boa partida"})
        server = chat.client.server
        status, answer, closed, took = await send_slowly(
            server, "/v1/tables/t-1/messages", token, body, 5
        )
        assert status == 408
        assert answer["error"]["code"] == "request_timeout"
        assert closed
        assert took >= DEADLINE_S
