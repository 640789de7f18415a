"""Slow clients (issue 31, part 2): a request whose body never arrives whole answers 408 within
``GIN_BODY_READ_S`` and its connection is closed, at the table service and at the chat, so a
client cannot hold a connection and a handler for as long as it likes; a body that arrives in
time is served as before. So with a request's head (``GIN_HEAD_READ_S``, ``serving.Runner``)
at every service, in tests and as ``service.main`` serves it, while an idle keep-alive
connection, pipelined requests and a WebSocket are left alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import msgspec
import pytest
from aiohttp.test_utils import TestClient

from services.bots.app import create_app as create_worker
from services.bots.strategies import STRATEGIES
from services.table.app import migrate as migrate_table
from shared.infra import amqp
from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.chat.conftest import open_chat
from tests.e2e.processes import Service
from tests.serving import ProductionServer
from tests.table.conftest import open_api, ws_receive
from tests.timers.conftest import open_timers

DEADLINE_S = 0.5
BOT_LEVEL = "carmen"  # as tests/bots/test_worker.py: a queue no other test seats a bot on


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


# --- the head: a request line and headers that never arrive whole (slowloris) ---------------

HEAD_DEADLINE_S = 0.5
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"
HEAD_TIMED_OUT = {
    "error": {
        "code": "request_timeout",
        "message": f"the request's headers did not arrive whole within {HEAD_DEADLINE_S:g} s",
        "rule": None,
    }
}
# uvloop, the services' event loop, keeps libuv's clock: whole milliseconds, read when a timer
# starts. A timer of 500 ms can so fire up to 1 ms before time.monotonic() has moved 0.5 s.
TIMER_GRAIN_S = 0.001
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
def head_quick(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, head_read_s=HEAD_DEADLINE_S)


@contextlib.asynccontextmanager
async def served(service: str, settings: Settings) -> AsyncIterator[tuple[str, int]]:
    """A service's real app, served as in production; its host and port."""
    if service == "table":
        async with open_api(settings) as api:
            yield api.client.server.host, api.client.server.port
    elif service == "chat":
        async with open_chat(settings) as chat:
            yield chat.client.server.host, chat.client.server.port
    elif service == "timers":
        await migrate_table(settings)  # the timers read the table's deadlines
        async with open_timers(settings) as client:
            yield client.server.host, client.server.port
    else:
        app = create_worker(settings, {BOT_LEVEL: STRATEGIES[BOT_LEVEL]})
        async with TestClient(ProductionServer(app)) as client:
            yield client.server.host, client.server.port


@contextlib.asynccontextmanager
async def connection(address: tuple[str, int]) -> AsyncIterator[Connection]:
    reader, writer = await asyncio.open_connection(*address)
    try:
        yield reader, writer
    finally:
        writer.close()


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """The next response on a connection: its status, its fields (names in lower case) and
    its body (it fails if none comes within 10 s)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    lines = head.decode("latin-1").split("\r\n")
    fields = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines[1:] if line)
    }
    body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), timeout=10)
    return int(lines[0].split()[1]), fields, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes the connection with nothing more (fails if it keeps it)."""
    return await asyncio.wait_for(reader.read(), timeout=5) == b""


def assert_not_sooner(began: float, seconds: float) -> None:
    """At least ``seconds`` have passed since ``began``, to the grain of the server's timers."""
    assert time.monotonic() - began >= seconds - TIMER_GRAIN_S


def assert_head_timed_out(status: int, fields: dict[str, str], body: bytes) -> None:
    assert status == 408, body
    assert fields["content-type"] == "application/json"
    assert fields["connection"] == "close"
    assert msgspec.json.decode(body) == HEAD_TIMED_OUT


async def a_request_line_and_then_nothing(address: tuple[str, int]) -> None:
    async with connection(address) as (reader, writer):
        began = time.monotonic()
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        assert_head_timed_out(*await answer(reader))
        assert_not_sooner(began, HEAD_DEADLINE_S)
        assert await closed(reader)


async def headers_a_byte_at_a_time(address: tuple[str, int]) -> None:
    """Each byte well within the deadline, the whole head far past it."""
    head = b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: " + b"z" * 40 + b"\r\n\r\n"
    async with connection(address) as (reader, writer):

        async def dribble() -> None:
            for byte in head:
                writer.write(bytes([byte]))
                await asyncio.sleep(HEAD_DEADLINE_S / 5)

        began = time.monotonic()
        dribbling = asyncio.create_task(dribble())
        try:
            assert_head_timed_out(*await answer(reader))
            assert_not_sooner(began, HEAD_DEADLINE_S)
            assert not dribbling.done(), "the head was sent whole before the answer"
            assert await closed(reader)
        finally:
            dribbling.cancel()
            await asyncio.gather(dribbling, return_exceptions=True)


async def idle_between_requests(address: tuple[str, int]) -> None:
    """A head sent whole is answered; a keep-alive connection then idle for longer than the
    head deadline, no byte of a next request sent, is not cut: its next request is served."""
    async with connection(address) as (reader, writer):
        writer.write(HEALTHZ)
        status, _, body = await answer(reader)
        assert status == 200, body
        await asyncio.sleep(HEAD_DEADLINE_S * 3)
        assert not reader.at_eof(), "an idle keep-alive connection was closed"
        writer.write(HEALTHZ)
        status, fields, body = await answer(reader)
        assert status == 200, body
        assert fields.get("connection", "keep-alive").lower() != "close"


@pytest.mark.parametrize("service", ["table", "chat", "timers", "bots"])
async def test_a_head_not_whole_within_the_deadline_answers_408_and_closes(
    service: str, head_quick: Settings
) -> None:
    async with served(service, head_quick) as address:
        await asyncio.gather(
            a_request_line_and_then_nothing(address),
            headers_a_byte_at_a_time(address),
            idle_between_requests(address),
        )


async def test_pipelined_requests_are_answered_and_a_partial_one_behind_them_times_out(
    head_quick: Settings,
) -> None:
    async with served("table", head_quick) as address, connection(address) as (reader, writer):
        writer.write(HEALTHZ + HEALTHZ)
        for _ in range(2):
            status, _, body = await answer(reader)
            assert status == 200, body
        # a whole request, then part of the next one in the same write, then nothing
        began = time.monotonic()
        writer.write(HEALTHZ + b"GET /healthz HTTP/1.1\r\nHo")
        status, _, body = await answer(reader)
        assert status == 200, body
        assert_head_timed_out(*await answer(reader))
        assert_not_sooner(began, HEAD_DEADLINE_S)
        assert await closed(reader)


async def test_a_body_slower_than_the_head_deadline_is_the_body_deadlines_to_judge(
    head_quick: Settings,
) -> None:
    """The body's bytes are no head's: a body sent over longer than the head deadline, within
    its own, is served."""
    async with open_api(head_quick) as api:
        address = (api.client.server.host, api.client.server.port)
        body = msgspec.json.encode({"options": {}})
        head = (
            f"POST /v1/tables HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer "
            f"{api.token('Ana')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        async with connection(address) as (reader, writer):
            began = time.monotonic()
            writer.write(head.encode())
            for byte in body:
                await asyncio.sleep(HEAD_DEADLINE_S * 3 / len(body))
                writer.write(bytes([byte]))
            status, _, answered = await answer(reader)
            assert status == 201, answered
            assert time.monotonic() - began >= HEAD_DEADLINE_S * 3
            # and the connection, idle past the head deadline, is kept for the next request
            await asyncio.sleep(HEAD_DEADLINE_S * 2)
            writer.write(HEALTHZ)
            status, _, answered = await answer(reader)
            assert status == 200, answered


async def test_a_table_websocket_outlives_the_head_deadline(head_quick: Settings) -> None:
    async with open_api(head_quick) as api:
        created = await api.create(api.token("Ana"))
        path = f"/v1/tables/{created['table_id']}/ws"
        async with api.client.ws_connect(path, autoping=False) as ws:
            snapshot = await ws_receive(ws)
            assert snapshot["kind"] == "snapshot"
            await ws.ping(b"after the upgrade")  # bytes on the socket: no request's head
            await asyncio.sleep(HEAD_DEADLINE_S * 3)
            await ws.ping(b"still here")
            for expected in (b"after the upgrade", b"still here"):
                pong = await ws.receive(timeout=5)
                assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, expected)
            assert not ws.closed


async def test_a_service_process_answers_a_head_past_its_deadline_with_408(
    settings: Settings, tmp_path: Path
) -> None:
    """``service.main`` serves through the runner with the head deadline: the bot worker as a
    process, ``GIN_HEAD_READ_S=0.5`` (on a broker prefix of its own), a request line sent
    and nothing more; then SIGTERM, and a clean exit with nothing logged as an error."""
    own = msgspec.structs.replace(settings, prefix=f"{settings.prefix}head.")
    log = tmp_path / "bots.log"
    worker = Service("services.bots", own, log_to=log, GIN_HEAD_READ_S=str(HEAD_DEADLINE_S))
    try:
        try:
            await worker.ready()
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(log.read_text(errors="replace")[-3000:]) from exc
        await a_request_line_and_then_nothing(("127.0.0.1", worker.port))
        worker.terminate()
        assert await asyncio.to_thread(worker.proc.wait, 30) == 0, log.read_text()[-3000:]
        lines = log.read_text(errors="replace").splitlines()
        levels = {msgspec.json.decode(line).get("level") for line in lines if line[:1] == "{"}
        assert not levels & {"error", "critical"}, lines
        assert not any("Traceback" in line for line in lines), lines
    finally:
        worker.stop()
        connection_ = await aio_pika.connect(own.amqp_url)
        async with connection_:
            await amqp.delete_topology(await connection_.channel(), own.prefix)
