"""``python -m bench.watchers BASE SECONDS TABLE_ID...``: idle spectators, from a process of
their own (reads ``BENCH_WATCH_SOCKETS`` and ``BENCH_WATCH_OPENING`` from the environment).

Opens that many anonymous table WebSockets, spread over the tables in turn, at most
``BENCH_WATCH_OPENING`` handshakes in flight; prints one JSON line when all are open (when the
first began, when the last was open, how many failed), then keeps every socket open and
reading for SECONDS, and prints one JSON line with the arrival time (``time.monotonic``, which
every process of the machine shares) of each table event by table and seq.

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
from collections import defaultdict
from typing import cast

import uvloop

_SEQ = re.compile(rb'"seq":(\d+)')
KEY = base64.b64encode(b"selminha-watcher").decode()


class Watcher(asyncio.Protocol):
    """One idle spectator: the handshake, then frames; answers pings; notes event arrivals."""

    def __init__(self, host: str, table_id: str, arrivals: dict[str, dict[int, list[float]]]):
        self.request = (
            f"GET /v1/tables/{table_id}/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {KEY}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        self.table_id = table_id
        self.arrivals = arrivals
        self.buffer = b""
        self.upgraded = False
        self.snapshot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        transport = self.transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            if not head.startswith(b"HTTP/1.1 101"):
                self._fail(head.split(b"\r\n", 1)[0].decode(errors="replace"))
                return
            self.upgraded, self.buffer = True, rest
        self._frames()

    def _frames(self) -> None:
        buf = self.buffer
        while len(buf) >= 2:
            opcode, size, start = buf[0] & 0x0F, buf[1] & 0x7F, 2
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
            self._frame(opcode, payload)
        self.buffer = buf

    def _frame(self, opcode: int, payload: bytes) -> None:
        if opcode == 0x9 and self.transport is not None:  # ping: a masked pong (zero mask)
            self.transport.write(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
        elif opcode == 0x1 and payload.startswith(b'{"kind":"snapshot"'):
            if not self.snapshot.done():
                self.snapshot.set_result(None)
        elif opcode == 0x1 and payload.startswith(b'{"kind":"event"'):
            found = _SEQ.search(payload)
            if found is not None:
                seq = int(found.group(1))
                self.arrivals[self.table_id][seq].append(time.monotonic())
        elif opcode == 0x8:
            self._fail("closed by the service")

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
    arrivals: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    loop = asyncio.get_running_loop()
    transports: list[asyncio.BaseTransport] = []
    failed: list[str] = []

    async def open_one(k: int) -> None:
        async with opening:
            try:
                transport, watcher = await loop.create_connection(
                    lambda: Watcher(host, tables[k % len(tables)], arrivals), host, int(port)
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
            {"opened": count - len(failed), "failed": len(failed), "began": began, "at": opened}
            | ({"first_failure": failed[0]} if failed else {})
        ),
        flush=True,
    )
    await asyncio.sleep(seconds)
    print(json.dumps({"arrivals": {t: dict(by_seq) for t, by_seq in arrivals.items()}}), flush=True)
    for transport in transports:
        transport.close()


def main() -> None:
    base, seconds, *tables = sys.argv[1:]
    uvloop.run(watch(base, float(seconds), tables))


if __name__ == "__main__":
    main()
