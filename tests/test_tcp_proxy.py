"""The tests' TCP proxy: a cut closes every connection, even one still connecting upstream."""

from __future__ import annotations

import asyncio
import contextlib

from tests.tcp_proxy import Proxy

CLIENTS = 40


async def test_a_cut_closes_every_connection_even_those_connecting_upstream() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = Proxy("127.0.0.1", upstream.sockets[0].getsockname()[1])
    await proxy.start()
    clients = []
    try:
        first = await asyncio.open_connection("127.0.0.1", proxy.port)
        first[1].write(b"ping")
        async with asyncio.timeout(5):
            assert await first[0].readexactly(4) == b"ping"
        # many accepted at once: the cut comes while their handlers connect upstream
        opening = (asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(CLIENTS))
        clients = [first, *await asyncio.gather(*opening)]
        await proxy.cut()
        assert not proxy.handlers
        assert not proxy.writers
        for reader, _ in clients:  # every one closed by the proxy, none left piping
            async with asyncio.timeout(5):
                with contextlib.suppress(ConnectionError):
                    assert await reader.read() == b""
        await proxy.start()  # the same port again
        again = await asyncio.open_connection("127.0.0.1", proxy.port)
        clients.append(again)
        again[1].write(b"pong")
        async with asyncio.timeout(5):
            assert await again[0].readexactly(4) == b"pong"
    finally:
        for _, writer in clients:
            writer.transport.abort()
        await proxy.cut()
        upstream.close()
        await upstream.wait_closed()
