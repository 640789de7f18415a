"""Compressed sockets (issue 31, part 4): a client that offers permessage-deflate, as every
browser does, is answered with no context takeover either way; each frame is compressed once
for every socket that gets it, so a socket holds no compressor of its own; small frames go
plain; a client's own compressed commands are read; and a socket costs about what a plain one
does. Clients here are raw sockets, so the frames' RSV1 bits and the answer's header are
seen as a browser gets them."""

from __future__ import annotations

import asyncio
import base64
import gc
import os
import struct
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest

from services.table import deflate
from services.table.ws import HUB
from shared.infra.internals import SHARED_DEFLATE
from shared.infra.settings import Settings
from tests.table.conftest import Api, open_api

CHROME_OFFER = "permessage-deflate; client_max_window_bits"
TRAILER = b"\x00\x00\xff\xff"


class Frame(msgspec.Struct):
    opcode: int
    compressed: bool
    payload: bytes  # as sent on the wire

    def text(self, window_bits: int = 15) -> Any:
        """The message, inflated on its own (no context from earlier frames) if compressed."""
        data = self.payload
        if self.compressed:
            inflater = zlib.decompressobj(-window_bits)
            data = inflater.decompress(data + TRAILER)
        return msgspec.json.decode(data)


class RawSocket:
    """A WebSocket client over a bare stream: the handshake it is given, frames as sent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.extensions: str | None = None

    async def handshake(self, path: str, offer: str | None) -> None:
        key = base64.b64encode(os.urandom(16)).decode()
        head = (
            f"GET {path} HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            + (f"Sec-WebSocket-Extensions: {offer}\r\n" if offer else "")
            + "\r\n"
        )
        self.writer.write(head.encode())
        answer = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = answer.decode().split("\r\n")
        assert lines[0].startswith("HTTP/1.1 101"), lines[0]
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "sec-websocket-extensions":
                self.extensions = value.strip()

    async def frame(self, within_s: float = 10.0) -> Frame:
        """The next data frame (pings answered, nothing fragmented expected)."""
        async with asyncio.timeout(within_s):
            while True:
                first, second = await self.reader.readexactly(2)
                size = second & 0x7F
                if size == 126:
                    (size,) = struct.unpack("!H", await self.reader.readexactly(2))
                elif size == 127:
                    (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
                payload = await self.reader.readexactly(size)
                assert first & 0x80, "a fragmented message"
                opcode = first & 0x0F
                if opcode == 0x9:
                    self.send(payload, opcode=0xA)
                    continue
                return Frame(opcode=opcode, compressed=bool(first & 0x40), payload=payload)

    def send(self, payload: bytes, opcode: int = 0x1, compressed: bool = False) -> None:
        """One masked frame, as a client must send it."""
        mask = os.urandom(4)
        first = 0x80 | (0x40 if compressed else 0) | opcode
        size = len(payload)
        head = bytes([first, 0x80 | size]) if size < 126 else struct.pack("!BBH", first, 0xFE, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(head + mask + masked)


@asynccontextmanager
async def raw_socket(api: Api, path: str, offer: str | None) -> AsyncIterator[RawSocket]:
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    sock = RawSocket(reader, writer)
    try:
        await sock.handshake(path, offer)
        yield sock
    finally:
        writer.close()


async def play_moves(api: Api, table_id: str, tokens: list[str], n: int) -> int:
    """``n`` plain moves by whoever is to act; the last event's seq."""
    last = 0
    for _ in range(n):
        seat = (await api.view(table_id))["hand"]["to_act"]
        view = await api.view(table_id, tokens[seat])
        move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
        status, body = await api.command(table_id, tokens[seat], **move)
        assert status == 200, body
        last = body["events"][-1]["seq"]
    return int(last)


async def events_until(sock: RawSocket, last: int, window_bits: int = 15) -> list[Frame]:
    frames = []
    while True:
        frame = await sock.frame()
        frames.append(frame)
        message = frame.text(window_bits)
        if message["kind"] == "event" and message["event"]["seq"] >= last:
            return frames


async def test_a_browsers_offer_is_answered_without_context_takeover(api: Api) -> None:
    table_id, ana, bia = await api.table_for_two()
    async with raw_socket(api, f"/v1/tables/{table_id}/ws", CHROME_OFFER) as sock:
        assert sock.extensions == SHARED_DEFLATE
        snapshot = await sock.frame()
        assert snapshot.compressed, "a snapshot is worth compressing"
        assert snapshot.text()["kind"] == "snapshot"
        assert snapshot.text() == (await plain_snapshot(api, table_id))
        last = await play_moves(api, table_id, [ana, bia], 4)
        frames = await events_until(sock, last)
    # every frame inflates on its own: nothing refers back to an earlier one
    assert [f.text()["event"]["seq"] for f in frames][-1] == last
    assert all(f.compressed for f in frames)
    assert sum(len(f.payload) for f in frames) < sum(
        len(msgspec.json.encode(f.text())) for f in frames
    )


async def plain_snapshot(api: Api, table_id: str) -> Any:
    async with raw_socket(api, f"/v1/tables/{table_id}/ws", None) as sock:
        assert sock.extensions is None
        frame = await sock.frame()
        assert not frame.compressed
        return frame.text()


async def test_every_watcher_gets_the_same_frame_compressed_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_id, ana, bia = await api.table_for_two()
    calls: list[bytes] = []
    real = deflate.compress

    def counted(frame: bytes, window_bits: int = 15) -> bytes:
        calls.append(frame)
        return real(frame, window_bits)

    monkeypatch.setattr(deflate, "compress", counted)
    path = f"/v1/tables/{table_id}/ws"
    async with (
        raw_socket(api, path, CHROME_OFFER) as one,
        raw_socket(api, path, CHROME_OFFER) as two,
        raw_socket(api, path, CHROME_OFFER) as three,
    ):
        firsts = [await s.frame() for s in (one, two, three)]
        assert firsts[0].payload == firsts[1].payload == firsts[2].payload
        calls.clear()
        last = await play_moves(api, table_id, [ana, bia], 3)
        got = [await events_until(s, last) for s in (one, two, three)]
    assert [f.payload for f in got[0]] == [f.payload for f in got[1]] == [f.payload for f in got[2]]
    compressed = [f for f in got[0] if f.compressed]
    assert compressed
    assert len(calls) == len(got[0]), "each event's frame compressed once, not once a socket"
    assert len(set(calls)) == len(calls)


async def test_a_smaller_server_window_asked_for_is_used(api: Api) -> None:
    table_id, ana, bia = await api.table_for_two()
    offer = "permessage-deflate; server_max_window_bits=10; client_max_window_bits"
    async with raw_socket(api, f"/v1/tables/{table_id}/ws", offer) as sock:
        assert sock.extensions == SHARED_DEFLATE + "; server_max_window_bits=10"
        snapshot = await sock.frame()
        assert snapshot.compressed
        assert snapshot.text(window_bits=10)["kind"] == "snapshot"
        last = await play_moves(api, table_id, [ana, bia], 2)
        frames = await events_until(sock, last, window_bits=10)
    assert frames[-1].text(window_bits=10)["event"]["seq"] == last


async def test_small_frames_go_plain_and_compressed_commands_are_read(api: Api) -> None:
    table_id, ana, bia = await api.table_for_two()
    async with raw_socket(api, f"/v1/tables/{table_id}/ws?token={ana}", CHROME_OFFER) as sock:
        await sock.frame()  # the snapshot
        bad = b'{"command": 7}'  # compressed, as a browser sends every message
        sock.send(deflate.compress(bad), compressed=True)
        error = await sock.frame()
        assert error.text()["kind"] == "error"
        assert len(msgspec.json.encode(error.text())) < deflate.MIN_BYTES
        assert not error.compressed, "a short frame is sent as it is"
        seat = (await api.view(table_id))["hand"]["to_act"]
        mover = [ana, bia][seat]
        view = await api.view(table_id, mover)
        move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw"))
        if mover == ana:
            message = msgspec.json.encode({"command": move})
            sock.send(deflate.compress(message), compressed=True)
            while (reply := (await sock.frame()).text())["kind"] == "event":
                pass
            assert reply["kind"] == "result", reply
        else:  # Bia moves over HTTP; Ana's socket still reads the events
            status, body = await api.command(table_id, mover, **move)
            assert status == 200, body
            frames = await events_until(sock, body["events"][-1]["seq"])
            assert frames


async def test_compression_can_be_declined(settings: Settings) -> None:
    async with open_api(msgspec.structs.replace(settings, ws_deflate=False)) as api:
        table_id, _, _ = await api.table_for_two()
        async with raw_socket(api, f"/v1/tables/{table_id}/ws", CHROME_OFFER) as sock:
            assert sock.extensions is None
            assert not (await sock.frame()).compressed


async def test_a_deflate_socket_holds_about_what_a_plain_one_does(api: Api) -> None:
    """The memory of sockets that negotiated deflate, after a snapshot and a few events each,
    against plain ones, as the process's allocator sees it (zlib's too): no compressor each."""
    table_id, ana, bia = await api.table_for_two()
    path = f"/v1/tables/{table_id}/ws"
    n = 40

    async def held(offer: str | None) -> float:
        gc.collect()
        tracemalloc.start()
        try:
            async with raw_sockets(api, path, offer, n) as socks:
                for sock in socks:
                    await sock.frame()
                last = await play_moves(api, table_id, [ana, bia], 2)
                for sock in socks:
                    await events_until(sock, last)
                gc.collect()
                current, _ = tracemalloc.get_traced_memory()
            return current / n
        finally:
            tracemalloc.stop()

    plain = await held(None)
    deflated = await held(CHROME_OFFER)
    # aiohttp's own compressor alone would be some hundreds of KiB a socket
    assert deflated - plain < 8 * 1024, (plain, deflated)
    assert api.client.app[HUB].sockets == 0


@asynccontextmanager
async def raw_sockets(
    api: Api, path: str, offer: str | None, n: int
) -> AsyncIterator[list[RawSocket]]:
    socks: list[RawSocket] = []
    server = api.client.server
    try:
        for _ in range(n):
            reader, writer = await asyncio.open_connection(server.host, server.port)
            sock = RawSocket(reader, writer)
            socks.append(sock)
            await sock.handshake(path, offer)
        yield socks
    finally:
        for sock in socks:
            sock.writer.close()
            await sock.writer.wait_closed()
        async with asyncio.timeout(10):
            while api.client.app[HUB].sockets:
                await asyncio.sleep(0.01)
