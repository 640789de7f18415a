"""Hostile and slow sockets (issue 13, part 4 and the sockets' parts of 1 and 5): nobody waits
for a socket. A spectator that never reads is dropped from the hub while a whole match is
played, the players and the other watchers never notice, and what it held is released; a
client past its queue is told to resume by seq; a failure after the commit never fails the
command; each frame is encoded once per view; oversized, binary and non-JSON messages; a
token that expires closes its socket."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from services.table.app import RELAY
from services.table.ws import (
    CLOSE_GOING_AWAY,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_TOKEN_EXPIRED,
    CLOSE_TOO_SLOW,
    HUB,
    TOKEN_EXPIRED_REASON,
    TOO_SLOW_REASON,
    WRITER_LIMIT_BYTES,
    Client,
    Hub,
    event_frame,
)
from shared.contracts.api import WsEvent
from shared.contracts.envelope import Envelope
from shared.contracts.views import TableView
from shared.infra.auth import Verifier, mint
from shared.infra.settings import Settings
from tests.table.conftest import (
    Api,
    all_events,
    assert_error_detail,
    open_api,
    play_to_the_end,
    ws_receive,
    ws_until,
)

BOUND = 16  # a send queue this short overflows within one match, on every run
TRANSPORT_PAUSES_AT = 64 * 1024  # asyncio's default high-water mark of a transport


def ws_path(table_id: str, token: str | None = None) -> str:
    return f"/v1/tables/{table_id}/ws" + (f"?token={token}" if token else "")


def hub_of(api: Api) -> Hub:
    return api.client.server.app[HUB]


async def metrics(api: Api) -> dict[str, float]:
    """This replica's metrics, by sample name and labels (``name{le="16.0"}``)."""
    async with api.client.get("/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {
        s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}")
        if s.labels
        else s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def watching(hub: Hub, table_id: str, name: str) -> Client:
    """The hub's client of ``name`` at a table, once its snapshot is queued."""
    async with asyncio.timeout(10):
        while True:
            for client in hub.clients.get(table_id, ()):
                if client.ready and client.identity and client.identity.name == name:
                    return client
            await asyncio.sleep(0.01)


class SilentSocket:
    """A WebSocket client with a tiny receive buffer that shakes hands by hand, reading the
    answer's headers byte by byte (nothing past them), and then never reads again."""

    def __init__(self, api: Api, path: str) -> None:
        self.host, self.port = api.client.server.host, api.client.server.port
        self.path = path
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    async def __aenter__(self) -> SilentSocket:
        loop = asyncio.get_running_loop()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
        self.sock.setblocking(False)
        await loop.sock_connect(self.sock, (self.host, self.port))
        key = base64.b64encode(os.urandom(16)).decode()
        handshake = (
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await loop.sock_sendall(self.sock, handshake.encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            byte = await loop.sock_recv(self.sock, 1)
            assert byte, f"the server hung up during the handshake: {head!r}"
            head += byte
        assert head.startswith(b"HTTP/1.1 101"), head
        return self

    async def read_to_the_end(self) -> int:
        """Read what reached this side until the server's end of the connection: the bytes."""
        loop = asyncio.get_running_loop()
        total = 0
        with contextlib.suppress(ConnectionError):
            while chunk := await loop.sock_recv(self.sock, 65536):
                total += len(chunk)
        return total

    async def __aexit__(self, *_: object) -> None:
        self.sock.close()


class Reader:
    """A normal WebSocket client, read all along; the size of each frame it got."""

    def __init__(self, api: Api, path: str) -> None:
        self.api = api
        self.path = path
        self.messages: list[dict[str, Any]] = []
        self.sizes: list[int] = []
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Reader:
        self.ws = await self.api.client.ws_connect(self.path)
        self.task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            self.sizes.append(len(msg.data.encode()))
            self.messages.append(msgspec.json.decode(msg.data))

    def seqs(self) -> list[int]:
        return [m["event"]["seq"] for m in self.messages if m["kind"] == "event"]

    async def wait_for_seq(self, seq: int) -> None:
        async with asyncio.timeout(15):
            while seq not in self.seqs():
                await asyncio.sleep(0.02)

    async def __aexit__(self, *_: object) -> None:
        assert self.ws is not None
        assert self.task is not None
        await self.ws.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def bounded(settings: Settings) -> AsyncIterator[Api]:
    """The real app with a short send queue."""
    async with open_api(msgspec.structs.replace(settings, ws_send_queue=BOUND)) as api:
        yield api


# --- a spectator that never reads ------------------------------------------------------------


async def test_a_spectator_that_never_reads_is_dropped_while_a_match_is_played(
    bounded: Api,
) -> None:
    api = bounded
    hub = hub_of(api)
    table_id, ana, bia = await api.table_for_two({"target": 150})
    before = (await all_events(api, table_id))[-1]["seq"]
    peak = {"frames": 0, "bytes": 0, "buffered": 0}
    async with (
        Reader(api, ws_path(table_id)) as watcher,
        SilentSocket(api, ws_path(table_id, api.token("Slow"))) as silent,
    ):
        slow = await watching(hub, table_id, "Slow")
        assert slow.transport is not None
        # The server's side of the connection buffers little too (the kernel would otherwise
        # take a whole match in for it): the writer meets the peer's pace within a few frames.
        server_side = slow.transport.get_extra_info("socket")
        server_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        async def measure(*_: object) -> None:
            peak["frames"] = max(peak["frames"], slow.frames.qsize())
            peak["bytes"] = max(peak["bytes"], slow.queued_bytes)
            if not slow.transport.is_closing():
                buffered = slow.transport.get_write_buffer_size()
                peak["buffered"] = max(peak["buffered"], buffered)

        # Every command answers 200 (play_to_the_end asserts it) while the spectator hangs.
        final = await play_to_the_end(api, table_id, [ana, bia], seed=3, on_step=measure)
        assert final["status"] == "match_over"
        last = (await all_events(api, table_id))[-1]["seq"]

        # The other spectator got every seq once, in order, after its snapshot.
        await watcher.wait_for_seq(last)
        assert watcher.messages[0]["kind"] == "snapshot"
        assert watcher.seqs() == list(range(before + 1, last + 1))

        # The silent one was dropped from the hub as too slow, its queue within the bound.
        assert slow.gone
        assert slow not in hub.clients.get(table_id, set())
        assert hub.clients[table_id] != set()  # the watcher still watches
        assert slow.closing is not None
        await slow.closing  # bounded by CLOSE_TIMEOUT_S: a hang is this test's timeout
        values = await metrics(api)
        assert values["gin_websockets_too_slow_total"] == 1.0
        assert values["gin_websockets"] == 1.0
        depth = "gin_websocket_send_queue_depth"
        assert values[f"{depth}_count"] > 0
        assert values[f'{depth}_bucket{{le="{float(BOUND)}"}}'] == values[f"{depth}_count"]
        assert peak["frames"] <= BOUND

        # Bounded memory: what it held, queued and in its transport, and released at the end.
        largest = max(watcher.sizes)
        assert 0 < peak["bytes"] <= BOUND * largest
        assert peak["buffered"] <= TRANSPORT_PAUSES_AT + WRITER_LIMIT_BYTES + largest
        assert slow.frames.empty()
        assert slow.queued_bytes == 0
        assert slow.transport.is_closing()
        assert slow.transport.get_write_buffer_size() == 0
        assert values["gin_websocket_queued_bytes"] == 0.0  # the watcher's queue is empty too
        # The silent client got only what was in flight: its connection has ended.
        got = await silent.read_to_the_end()
        assert got < sum(watcher.sizes)


async def test_the_mover_does_not_wait_for_a_socket_that_never_takes_a_frame(
    bounded: Api,
) -> None:
    """A socket whose every write and close wait for ever, at a table a match is played at:
    each command answers, the socket is dropped, and its close gives up and aborts."""
    api = bounded
    hub = hub_of(api)
    table_id, ana, bia = await api.table_for_two({"target": 50})
    stuck = await hub.open(table_id, StuckSocket(), None, FakeTransport())  # type: ignore[arg-type]
    stuck.last_seq = (await all_events(api, table_id))[-1]["seq"]
    stuck.ready = True
    try:
        final = await play_to_the_end(api, table_id, [ana, bia], seed=5)
        assert final["status"] == "match_over"
        assert stuck.gone
        assert stuck not in hub.clients.get(table_id, set())
        assert stuck.closing is not None
        await stuck.closing
        assert stuck.ws.close_codes == [CLOSE_TOO_SLOW]  # type: ignore[attr-defined]
        assert stuck.transport.aborted  # type: ignore[union-attr]
        assert len(stuck.ws.written) == 1  # type: ignore[attr-defined]
        assert stuck.queued_bytes == 0
    finally:
        assert stuck.writer is not None
        stuck.writer.cancel()


async def test_a_command_answers_before_its_delivery_starts(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery of a commit never ends here: the commands still answer, one after
    another; the first one's delivery began and holds the second's behind it."""
    hub = hub_of(api)
    table_id, ana, bia = await api.table_for_two()
    began: list[int] = []

    async def never_done(change: Any) -> None:
        began.append(change.row.version)
        await asyncio.Event().wait()

    monkeypatch.setattr(hub, "deliver_local", never_done)
    tokens = [ana, bia]
    async with api.client.ws_connect(ws_path(table_id)) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        public = await api.view(table_id)
        seat = public["hand"]["to_act"]
        status, first = await api.command(table_id, tokens[seat], type="pass_upcard")
        assert status == 200, first
        status, second = await api.command(table_id, tokens[1 - seat], type="pass_upcard")
        assert status == 200, second
        async with asyncio.timeout(10):
            while not began:
                await asyncio.sleep(0.01)
        assert began == [first["version"]]  # and it never finished: the second waits behind


async def test_a_failure_after_the_commit_never_fails_the_command(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = api.client.server.app
    table_id, ana, bia = await api.table_for_two()

    def broken(*_: object) -> None:
        raise RuntimeError("after the commit")

    monkeypatch.setattr(app[HUB], "committed", broken)
    monkeypatch.setattr(app[RELAY], "committed", broken)
    seat = (await api.view(table_id))["hand"]["to_act"]
    async with api.client.ws_connect(ws_path(table_id)) as ws:  # so the hub is handed it
        assert (await ws_receive(ws))["kind"] == "snapshot"
        with structlog.testing.capture_logs() as logs:
            status, body = await api.command(table_id, [ana, bia][seat], type="pass_upcard")
    assert status == 200, body
    assert (await all_events(api, table_id))[-1] == body["events"][-1]
    failed = {entry["event"] for entry in logs if entry["log_level"] == "error"}
    assert failed == {"relay_wake_failed", "ws_handoff_failed"}


class FailingPool:
    """A pool that cannot give a connection while ``failing`` (the database away)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.failing = True
        self.refused = 0

    def acquire(self) -> Any:
        if self.failing:
            self.refused += 1
            raise ConnectionRefusedError("the database is away")
        return self.pool.acquire()


async def test_a_relay_batch_the_hub_cannot_apply_yet_is_applied_later(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit this replica hears of only from its relay batch (as another replica's), while
    the hub cannot read the database: the batch's catch-up fails, and once the database
    answers the watcher still gets the event (the batch was not dropped)."""
    hub = hub_of(api)
    table_id, ana, bia = await api.table_for_two()
    monkeypatch.setattr(hub, "committed", lambda _change: None)  # as if another replica's
    seat = (await api.view(table_id))["hand"]["to_act"]
    async with api.client.ws_connect(ws_path(table_id)) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        failing = FailingPool(hub.pool)
        monkeypatch.setattr(hub, "pool", failing)
        status, body = await api.command(table_id, [ana, bia][seat], type="pass_upcard")
        assert status == 200, body
        async with asyncio.timeout(10):
            while not failing.refused:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # a retry or two fails too
        failing.failing = False
        seqs = [e["seq"] for e in body["events"]]
        got = [(await ws_receive(ws))["event"]["seq"] for _ in seqs]
        assert got == seqs
        assert not hub.behind


# --- told to resume, and the close codes ------------------------------------------------------


async def test_a_client_past_its_queue_is_closed_with_4008_and_resumes_by_seq(
    bounded: Api,
) -> None:
    api = bounded
    hub = hub_of(api)
    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    watcher = api.token("Lagging")
    async with api.client.ws_connect(ws_path(table_id, watcher)) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        seat = (await api.view(table_id))["hand"]["to_act"]
        status, result = await api.command(table_id, tokens[seat], type="pass_upcard")
        assert status == 200, result
        seen = result["events"][-1]["seq"]
        await ws_until(ws, lambda ms: any(m.get("event", {}).get("seq") == seen for m in ms))
        # A burst past the queue's bound, queued faster than any peer could take it.
        client = await watching(hub, table_id, "Lagging")
        for _ in range(BOUND + 1):
            hub.send(client, b'{"kind":"noise"}')
        async with asyncio.timeout(10):
            while (msg := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                pass
        assert msg.type == aiohttp.WSMsgType.CLOSE, msg
        assert msg.data == CLOSE_TOO_SLOW
        assert msg.extra == TOO_SLOW_REASON
        assert "events?after=" in msg.extra
    # Meanwhile the game goes on; the client resumes: a snapshot, then the log after its seq.
    status, more = await api.command(table_id, tokens[1 - seat], type="pass_upcard")
    assert status == 200, more
    async with api.client.ws_connect(ws_path(table_id, watcher)) as ws:
        snapshot = await ws_receive(ws)
        assert snapshot["kind"] == "snapshot"
        assert snapshot["view"]["version"] == more["version"]
        missed = await all_events(api, table_id, after=seen)
        assert missed == more["events"]


async def test_shutdown_does_not_wait_on_a_peer_that_does_not_read(api: Api) -> None:
    hub = hub_of(api)
    table_id, _, _ = await api.table_for_two()
    stuck = await hub.open(table_id, StuckSocket(), None, FakeTransport())  # type: ignore[arg-type]
    stuck.ready = True
    try:
        hub.send(stuck, b'{"kind":"noise"}')  # its writer now waits in the middle of a frame
        async with asyncio.timeout(5):
            while not stuck.writing:
                await asyncio.sleep(0.01)
        await hub.close_all()  # returns: each close is bounded
        assert stuck.ws.close_codes == [CLOSE_GOING_AWAY]  # type: ignore[attr-defined]
        assert stuck.transport.aborted  # type: ignore[union-attr]
        assert table_id not in hub.clients
    finally:
        assert stuck.writer is not None
        stuck.writer.cancel()


async def test_an_oversized_message_closes_the_socket_with_1009(
    api: Api, settings: Settings
) -> None:
    table_id, ana, _ = await api.table_for_two()
    async with api.client.ws_connect(ws_path(table_id, ana)) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        await ws.send_str("{" + " " * (settings.ws_max_frame_bytes - 100))  # under: refused
        reply = await ws_receive(ws)
        assert reply["kind"] == "error"
        assert_error_detail(reply["error"], "malformed_json", None)
        await ws.send_str(" " * (settings.ws_max_frame_bytes + 1))
        msg = await asyncio.wait_for(ws.receive(), 10)
        assert msg.type == aiohttp.WSMsgType.CLOSE, msg
        assert msg.data == CLOSE_MESSAGE_TOO_BIG == 1009
    assert ws.close_code == 1009
    async with asyncio.timeout(10):  # the handler ends, and lets go of its client
        while table_id in hub_of(api).clients:
            await asyncio.sleep(0.01)


async def test_binary_and_non_json_frames_answer_errors_and_the_socket_goes_on(
    api: Api,
) -> None:
    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    seat = (await api.view(table_id))["hand"]["to_act"]
    command = {"kind": "command", "command": {"type": "pass_upcard", "command_id": "bin-1"}}
    async with api.client.ws_connect(ws_path(table_id, tokens[seat])) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        for sent, code in (
            (msgspec.json.encode(command), "invalid_request"),  # a command, but binary
            (b"\xff\x00\xfe", "invalid_request"),
            ("pass the upcard", "malformed_json"),
            ('{"kind": "command", "command": ', "malformed_json"),
            ("[]", "invalid_request"),
        ):
            if isinstance(sent, bytes):
                await ws.send_bytes(sent)
            else:
                await ws.send_str(sent)
            reply = await ws_receive(ws)
            assert reply["kind"] == "error", reply
            assert_error_detail(reply["error"], code, None)
        assert (await all_events(api, table_id))[-1]["type"] != "upcard_passed"
        # Still open, and still the same socket: a command in a text frame is applied.
        await ws.send_str(msgspec.json.encode(command).decode())
        messages = await ws_until(ws, lambda ms: any(m["kind"] == "result" for m in ms))
        result = next(m["result"] for m in messages if m["kind"] == "result")
        assert [e["type"] for e in result["events"]] == ["upcard_passed"]


async def test_a_socket_closes_with_4001_when_its_token_expires(settings: Settings) -> None:
    strict = msgspec.structs.replace(settings, auth_leeway_s=0.0)
    async with open_api(strict) as api:
        table_id, ana, _ = await api.table_for_two()
        brief = mint(settings.auth_secret, "brief-watcher", "Brief", ttl_s=2)
        async with (
            api.client.ws_connect(ws_path(table_id, brief)) as expiring,
            api.client.ws_connect(ws_path(table_id, ana)) as lasting,  # 30 days
            api.client.ws_connect(ws_path(table_id)) as anonymous,
        ):
            for ws in (expiring, lasting, anonymous):
                assert (await ws_receive(ws))["kind"] == "snapshot"
            msg = await asyncio.wait_for(expiring.receive(), 15)
            assert msg.type == aiohttp.WSMsgType.CLOSE, msg
            assert msg.data == CLOSE_TOKEN_EXPIRED == 4001
            assert msg.extra == TOKEN_EXPIRED_REASON
            assert Verifier(settings.auth_secret).verify(ana).id in {
                c.identity.id for c in hub_of(api).clients[table_id] if c.identity
            }
            assert not lasting.closed
            assert not anonymous.closed


# --- encoded once per view ------------------------------------------------------------------


async def test_each_frame_is_encoded_once_per_view_and_shared(api: Api) -> None:
    hub = hub_of(api)
    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    seq = (await all_events(api, table_id))[-1]["seq"]
    seated = Verifier(api.settings.auth_secret).verify(ana)
    clients = [
        await hub.open(table_id, RecordingSocket(), identity)  # type: ignore[arg-type]
        for identity in (None, None, seated)
    ]
    for client in clients:
        client.last_seq = seq
        client.ready = True
    try:
        for _ in range(3):
            public = await api.view(table_id)
            seat = public["hand"]["to_act"]
            view = await api.view(table_id, tokens[seat])
            move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw"))
            status, body = await api.command(table_id, tokens[seat], **move)
            assert status == 200, body
        last = body["events"][-1]["seq"]
        async with asyncio.timeout(10):
            while any(c.last_seq < last or not c.frames.empty() for c in clients):
                await asyncio.sleep(0.01)
        one, two, mine = (c.ws.written for c in clients)  # type: ignore[attr-defined]
        assert len(one) == len(two) == len(mine) == last - seq
        assert all(a is b for a, b in zip(one, two, strict=True))  # the very same bytes
        assert all(a != b for a, b in zip(one, mine, strict=True))  # another view
        for frame in mine:
            decoded = msgspec.json.decode(frame)
            assert decoded["view"]["you"] == 0
        for frame in one:
            assert msgspec.json.decode(frame)["view"]["you"] is None
    finally:
        for client in clients:
            await hub.release(client)


async def test_an_event_frame_is_what_msgspec_writes_for_a_ws_event(api: Api) -> None:
    table_id, ana, _ = await api.table_for_two()
    encoder = msgspec.json.Encoder()
    events = [msgspec.convert(e, Envelope) for e in await all_events(api, table_id)]
    for token in (None, ana):
        view = msgspec.convert(await api.view(table_id, token), TableView)
        for envelope in events:
            spliced = event_frame(encoder.encode(envelope), encoder.encode(view))
            assert spliced == encoder.encode(WsEvent(event=envelope, view=view))


# --- stand-ins for a peer ---------------------------------------------------------------------


class StuckSocket:
    """The server's end of a socket whose peer takes nothing: a write or a close never ends."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.close_codes: list[int] = []
        self.closed = False

    async def send_frame(self, frame: bytes, opcode: aiohttp.WSMsgType) -> None:
        self.written.append(frame)
        await asyncio.Event().wait()

    async def close(self, *, code: int, message: bytes) -> bool:
        self.close_codes.append(code)
        await asyncio.Event().wait()
        return True


class RecordingSocket:
    """A socket that takes every frame at once and keeps it (the very object)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    async def send_frame(self, frame: bytes, opcode: aiohttp.WSMsgType) -> None:
        self.written.append(frame)

    async def close(self, *, code: int, message: bytes) -> bool:
        self.closed = True
        return True


class FakeTransport:
    """A transport full of bytes its peer never took, until it is aborted."""

    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0 if self.aborted else 1 << 20
