"""A TCP proxy that can cut its clients off: ``make chaos-cluster`` puts one in front of each
PostgreSQL node for one table replica, so that replica alone loses the database.

Three states. ``forward``: every connection is piped to the target. ``drop``: every open
connection is reset (RST, not FIN: what a client sees when a middlebox or a node forgets it)
and the proxy goes on to ``blackhole``: new connections are accepted and held, nothing is read
or forwarded, as when packets vanish (the client's connect succeeds and its first read hangs).
``forward`` again resets the held ones and pipes the next ones. ``stop`` resets everything,
even a connection whose pipe was still being opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

CHUNK = 64 * 1024


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class CutProxy:
    """``127.0.0.1:<port>`` forwarded to ``127.0.0.1:<target>`` until cut off."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.mode = "forward"
        self.pipes: set[asyncio.StreamWriter] = set()  # both ends of every open pipe
        self.held: set[asyncio.StreamWriter] = set()  # accepted while blackholed
        self.accepted = 0
        self.server: asyncio.Server | None = None

    async def start(self, port: int = 0) -> int:
        """Listen; the port."""
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    def drop(self) -> int:
        """Reset every open connection and blackhole the next ones; how many were reset."""
        self.mode = "blackhole"
        return self._reset_all(self.pipes)

    def forward(self) -> int:
        """Pipe again; the held connections are reset (their clients gave up long ago)."""
        self.mode = "forward"
        return self._reset_all(self.held)

    @staticmethod
    def _reset_all(writers: set[asyncio.StreamWriter]) -> int:
        count = len(writers)
        for writer in list(writers):
            reset(writer)
        writers.clear()
        return count

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "stopped":
            reset(writer)
            return
        if self.mode != "forward":
            self.held.add(writer)  # never read: the client waits for an answer that never comes
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            reset(writer)  # the node is down: the client sees a refused connection at once
            return
        if self.mode == "stopped":  # stopped while connecting: nothing may stay open
            reset(up_writer)
            reset(writer)
            return
        if self.mode != "forward":  # cut while connecting
            reset(up_writer)
            self.held.add(writer)
            return
        self.pipes |= {writer, up_writer}
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                self.pipes.discard(end)
                end.transport.abort()

    async def stop(self) -> None:
        """Stop listening; reset everything open, and whatever a handler still connecting
        upstream opens next."""
        self.mode = "stopped"
        if self.server is not None:
            self.server.close()
        self._reset_all(self.pipes)
        self._reset_all(self.held)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either end goes; a reset end stops both directions."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.transport.abort()
