"""``python -m bench.watchers BASE SECONDS TABLE_ID...``: idle spectators, from a process of
their own (reads ``BENCH_WATCH_SOCKETS``, ``BENCH_WATCH_OPENING`` and ``BENCH_WATCH_DEFLATE``
from the environment).

Opens that many anonymous table WebSockets, spread over the tables in turn, at most
``BENCH_WATCH_OPENING`` handshakes in flight; prints one JSON line when all are open (when the
first began, when the last was open, how many failed, the extension the service answered),
then keeps every socket open and reading for SECONDS, and prints one JSON line with the
arrival time (``time.monotonic``, which every process of the machine shares) of each table
event by table and seq, and what the sockets read (``Counts``).

``BENCH_WATCH_DEFLATE=1``: each handshake offers permessage-deflate as Chrome does
(``permessage-deflate; client_max_window_bits``). A message whose first frame has RSV1 set
is inflated as RFC 7692 says (its payload, then ``00 00 ff ff``, through raw DEFLATE): with a
fresh decompressor per message if the service answered ``server_no_context_takeover``, else
with the socket's one decompressor (context takeover). A message without RSV1 is plain, even
on a socket that negotiated deflate. Whatever the client cannot read (a malformed answer, a
frame it does not understand) fails its socket, counted and reported.

A lean client (an ``asyncio.Protocol`` per socket, no task, frames parsed by hand), so that
thousands of sockets cost this process less than they cost the service.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
import time
import zlib
from collections import defaultdict
from typing import Any, cast

import uvloop

_SEQ = re.compile(rb'"seq":(\d+)')
KEY = base64.b64encode(b"selminha-watcher").decode()
# What Chrome offers (and Firefox, Safari alike): the extension, no window asked of the server.
OFFER = "permessage-deflate; client_max_window_bits"
TAIL = b"\x00\x00\xff\xff"  # RFC 7692 7.2.2: stripped by the sender, put back to inflate
CONTROL = 0x8  # opcodes from 0x8 up are control frames: never fragmented, never compressed
# A message read: opcode, payload (inflated), its payload bytes on the wire, whether compressed.
Message = tuple[int, bytes, int, bool]


class ProtocolError(ValueError):
    """What the service sent is not what RFC 6455 / RFC 7692 allow (or this client reads)."""


def negotiated(header: str | None, offered: bool) -> tuple[bool, bool]:
    """From the 101's ``Sec-WebSocket-Extensions`` (None: absent): whether permessage-deflate
    was accepted, and whether the service said ``server_no_context_takeover``. Raises
    ProtocolError on anything else: an extension not offered, an unknown or repeated parameter,
    a bad window size."""
    if header is None or not header.strip():
        return False, False
    if not offered:
        raise ProtocolError(f"extension answered but none offered: {header!r}")
    if "," in header:
        raise ProtocolError(f"more than one extension answered: {header!r}")
    name, *params = (part.strip() for part in header.split(";"))
    if name.lower() != "permessage-deflate":
        raise ProtocolError(f"an extension not offered: {header!r}")
    seen: set[str] = set()
    for param in params:
        key, eq, value = (p.strip() for p in param.partition("="))
        key = key.lower()
        if key in seen:
            raise ProtocolError(f"{key} twice: {header!r}")
        seen.add(key)
        if key in ("server_no_context_takeover", "client_no_context_takeover"):
            if eq:
                raise ProtocolError(f"{key} takes no value: {header!r}")
        elif key in ("server_max_window_bits", "client_max_window_bits"):
            if value.strip('"') not in {str(bits) for bits in range(8, 16)}:
                raise ProtocolError(f"{key} needs a value from 8 to 15: {header!r}")
        else:
            raise ProtocolError(f"unknown parameter {key!r}: {header!r}")
    return True, "server_no_context_takeover" in seen


class Reader:
    """Frames from the wire to whole messages, inflating those compressed.

    ``feed(data)`` gives each message completed so far as (opcode, payload, bytes it took on
    the wire, whether it was compressed); control frames come as they arrive, between the
    fragments of a message if they are sent there."""

    __slots__ = ("buffer", "compressed", "deflate", "fresh", "inflater", "opcode", "parts")

    def __init__(self, deflate: bool = False, no_context_takeover: bool = False) -> None:
        self.buffer = b""
        self.deflate = deflate
        self.fresh = no_context_takeover  # a decompressor per message, else one per socket
        self.inflater: Any = None  # zlib's _Decompress: made at the first compressed message
        self.parts: list[bytes] | None = None  # a fragmented message's frames so far
        self.opcode = 0
        self.compressed = False

    def feed(self, data: bytes) -> list[Message]:
        buf = self.buffer + data if self.buffer else data
        done: list[Message] = []
        while len(buf) >= 2:
            first, size, start = buf[0], buf[1] & 0x7F, 2
            if buf[1] & 0x80:
                raise ProtocolError("a masked frame from the server")
            if size == 126:
                if len(buf) < 4:
                    break
                size, start = int.from_bytes(buf[2:4], "big"), 4
            elif size == 127:
                if len(buf) < 10:
                    break
                size, start = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < start + size:
                break
            payload, buf = buf[start : start + size], buf[start + size :]
            message = self._frame(first, payload)
            if message is not None:
                done.append(message)
        self.buffer = buf
        return done

    def _frame(self, first: int, payload: bytes) -> Message | None:
        fin, rsv1, opcode = first & 0x80, first & 0x40, first & 0x0F
        if first & 0x30:
            raise ProtocolError(f"RSV2/RSV3 set: first byte {first:#04x}")
        if rsv1 and not self.deflate:
            raise ProtocolError("RSV1 set on a socket that negotiated no deflate")
        if opcode >= CONTROL:
            if not fin or rsv1 or len(payload) > 125:
                raise ProtocolError(f"a control frame fragmented, compressed or long: {first:#04x}")
            return opcode, payload, len(payload), False
        if opcode == 0x0:  # a continuation: RSV1 belongs to the first frame only
            if self.parts is None:
                raise ProtocolError("a continuation frame with no message begun")
            if rsv1:
                raise ProtocolError("RSV1 set on a continuation frame")
            self.parts.append(payload)
            if not fin:
                return None
            payload, self.parts = b"".join(self.parts), None
            return self._message(self.opcode, payload, self.compressed)
        if self.parts is not None:
            raise ProtocolError("a new message began inside a fragmented one")
        if not fin:
            self.parts, self.opcode, self.compressed = [payload], opcode, bool(rsv1)
            return None
        return self._message(opcode, payload, bool(rsv1))

    def _message(self, opcode: int, payload: bytes, compressed: bool) -> Message:
        if not compressed:
            return opcode, payload, len(payload), False
        if self.fresh:
            inflater = zlib.decompressobj(-15)
        else:
            if self.inflater is None:
                self.inflater = zlib.decompressobj(-15)
            inflater = self.inflater
        try:
            data = inflater.decompress(payload + TAIL)
        except zlib.error as exc:
            raise ProtocolError(f"a compressed message that does not inflate: {exc}") from exc
        if inflater.eof and not self.fresh:  # BFINAL: the next message would lose its context
            raise ProtocolError("a final DEFLATE block under context takeover: not handled")
        return opcode, data, len(payload), True


class Counts:
    """What one process's sockets read: data messages compressed and plain, their bytes on
    the wire and inflated, the same for table events alone, and the extension answered."""

    def __init__(self) -> None:
        self.extension: str | None = None  # the first Sec-WebSocket-Extensions answered
        self.deflate_sockets = 0  # sockets that negotiated permessage-deflate
        self.no_takeover_sockets = 0  # of those, with server_no_context_takeover
        self.messages_compressed = 0
        self.messages_plain = 0
        self.wire_bytes = 0
        self.bytes = 0
        self.events = 0
        self.events_compressed = 0
        self.event_wire_bytes = 0
        self.event_bytes = 0
        self.protocol_errors = 0
        self.first_protocol_error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return dict(vars(self))


class Watcher(asyncio.Protocol):
    """One idle spectator: the handshake, then frames; answers pings; notes event arrivals."""

    def __init__(
        self,
        host: str,
        table_id: str,
        arrivals: dict[str, dict[int, list[float]]],
        counts: Counts,
        deflate: bool = False,
    ):
        offer = f"Sec-WebSocket-Extensions: {OFFER}\r\n" if deflate else ""
        self.request = (
            f"GET /v1/tables/{table_id}/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {KEY}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{offer}\r\n"
        ).encode()
        self.offered = deflate
        self.table_id = table_id
        self.arrivals = arrivals
        self.counts = counts
        self.head = b""
        self.reader: Reader | None = None  # once upgraded
        self.snapshot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        transport = self.transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        try:
            if self.reader is None:
                self.head += data
                head, sep, data = self.head.partition(b"\r\n\r\n")
                if not sep:
                    return
                self.head = b""
                if not head.startswith(b"HTTP/1.1 101"):
                    self._fail(head.split(b"\r\n", 1)[0].decode(errors="replace"))
                    return
                self.reader = self._upgrade(head)
            for opcode, payload, wire, compressed in self.reader.feed(data):
                self._message(opcode, payload, wire, compressed)
        except ProtocolError as exc:
            self.counts.protocol_errors += 1
            if self.counts.first_protocol_error is None:
                self.counts.first_protocol_error = str(exc)
            self._fail(f"protocol error: {exc}")

    def _upgrade(self, head: bytes) -> Reader:
        """The reader the 101's extension asks for."""
        values = [
            line.partition(b":")[2].strip().decode("latin-1")
            for line in head.split(b"\r\n")[1:]
            if line.partition(b":")[0].strip().lower() == b"sec-websocket-extensions"
        ]
        header = ", ".join(values) if values else None
        counts = self.counts
        if counts.extension is None and header is not None:
            counts.extension = header
        deflate, no_takeover = negotiated(header, self.offered)
        counts.deflate_sockets += deflate
        counts.no_takeover_sockets += no_takeover
        return Reader(deflate, no_takeover)

    def _message(self, opcode: int, payload: bytes, wire: int, compressed: bool) -> None:
        counts = self.counts
        if opcode == 0x9 and self.transport is not None:  # ping: a masked pong (zero mask)
            self.transport.write(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
            return
        if opcode == 0x8:
            self._fail("closed by the service")
            return
        if opcode not in (0x1, 0x2):
            return  # a pong
        if compressed:
            counts.messages_compressed += 1
        else:
            counts.messages_plain += 1
        counts.wire_bytes += wire
        counts.bytes += len(payload)
        if payload.startswith(b'{"kind":"snapshot"'):
            if not self.snapshot.done():
                self.snapshot.set_result(None)
        elif payload.startswith(b'{"kind":"event"'):
            counts.events += 1
            counts.events_compressed += compressed
            counts.event_wire_bytes += wire
            counts.event_bytes += len(payload)
            found = _SEQ.search(payload)
            if found is not None:
                seq = int(found.group(1))
                self.arrivals[self.table_id][seq].append(time.monotonic())

    def _fail(self, why: str) -> None:
        if not self.snapshot.done():
            self.snapshot.set_exception(ConnectionError(why))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection lost: {exc!r}")


async def watch(base: str, seconds: float, tables: list[str]) -> None:
    """Open the sockets, report, keep them for ``seconds``, report the arrivals."""
    host, _, port = base.removeprefix("http://").partition(":")
    count = int(os.environ.get("BENCH_WATCH_SOCKETS", "1000"))
    opening = asyncio.Semaphore(int(os.environ.get("BENCH_WATCH_OPENING", "200")))
    deflate = os.environ.get("BENCH_WATCH_DEFLATE", "0") == "1"
    arrivals: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts = Counts()
    loop = asyncio.get_running_loop()
    transports: list[asyncio.BaseTransport] = []
    failed: list[str] = []

    async def open_one(k: int) -> None:
        async with opening:
            try:
                transport, watcher = await loop.create_connection(
                    lambda: Watcher(host, tables[k % len(tables)], arrivals, counts, deflate),
                    host,
                    int(port),
                )
                transports.append(transport)
                await asyncio.wait_for(watcher.snapshot, 30)
            except (OSError, ConnectionError, TimeoutError) as exc:
                failed.append(repr(exc))

    began = time.monotonic()
    await asyncio.gather(*(open_one(k) for k in range(count)))
    opened = time.monotonic()
    print(
        json.dumps(
            {
                "opened": count - len(failed),
                "failed": len(failed),
                "began": began,
                "at": opened,
                "offered": OFFER if deflate else None,
                "extension": counts.extension,
                "deflate_sockets": counts.deflate_sockets,
                "no_takeover_sockets": counts.no_takeover_sockets,
            }
            | ({"first_failure": failed[0]} if failed else {})
        ),
        flush=True,
    )
    await asyncio.sleep(seconds)
    print(
        json.dumps(
            {
                "arrivals": {t: dict(by_seq) for t, by_seq in arrivals.items()},
                "counts": counts.as_json(),
            }
        ),
        flush=True,
    )
    for transport in transports:
        transport.close()


def main() -> None:
    base, seconds, *tables = sys.argv[1:]
    uvloop.run(watch(base, float(seconds), tables))


if __name__ == "__main__":
    main()
