"""A TCP proxy that a test cuts (closing every connection and refusing new ones) and restores
on the same port: a database or broker outage seen from the services behind it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from urllib.parse import urlsplit, urlunsplit


class Proxy:
    """``127.0.0.1:<port>`` piped to ``host:port`` until cut.

    Every connection's handler is tracked from its first step, so a cut (and the test's end)
    leaves none behind: one that was still connecting upstream when the cut came would
    otherwise pipe on unseen, and the loop's end would cancel it with both sockets open.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.server: asyncio.Server | None = None
        self.generation = 0  # which listening the proxy is in; a cut ends one
        self.writers: set[asyncio.StreamWriter] = set()
        self.handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        serve = functools.partial(self._serve, self.generation)
        self.server = await asyncio.start_server(serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Stop listening, close every connection and wait until every handler has ended."""
        self.generation += 1
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        handlers = list(self.handlers)
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()
            self.server = None

    async def _serve(
        self, generation: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self.handlers.add(handler)
        self.writers.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            if generation != self.generation:  # accepted just before a cut
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self.writers.add(up_writer)
            if generation != self.generation:  # cut while connecting upstream
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            for end in (writer, up_writer):
                if end is not None:
                    end.transport.abort()
                    self.writers.discard(end)
            self.handlers.discard(handler)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until either end goes; then the other end is closed too."""
    with contextlib.suppress(OSError, ConnectionError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    dst.transport.abort()


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))
