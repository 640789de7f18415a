"""SIGTERM to one of two table-service processes with open WebSockets: its clients get 1001,
reconnect to the other, and miss no event."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.e2e.processes import Service

pytestmark = pytest.mark.slow


async def call(
    session: aiohttp.ClientSession, method: str, url: str, token: str, body: Any = None
) -> Any:
    async with session.request(
        method, url, json=body, headers={"Authorization": f"Bearer {token}"}
    ) as r:
        assert r.status < 300, await r.text()
        return await r.json()


async def next_move(
    session: aiohttp.ClientSession, base: str, table: str, tokens: list[str]
) -> None:
    """The seat to act plays its SOBRA's discard, or the first legal draw or pass."""
    public = await call(session, "GET", f"{base}/v1/tables/{table}", tokens[0])
    seat = public["hand"]["to_act"]
    view = await call(session, "GET", f"{base}/v1/tables/{table}", tokens[seat])
    hint = view["hand"]["my_arrangement"].get("discard")
    moves = [m for m in view["legal"] if m["type"] in ("pass_upcard", "draw")]
    move = {"type": "discard", "card": hint} if hint else moves[0]
    await call(session, "POST", f"{base}/v1/tables/{table}/commands", tokens[seat], move)


async def collect(ws: aiohttp.ClientWebSocketResponse, seqs: list[int]) -> int | None:
    """Record event seqs until the socket closes; the close code."""
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.TEXT:
            data = msg.json()
            if data["kind"] == "snapshot":
                continue
            seqs.append(data["event"]["seq"])
    return ws.close_code


async def test_sigterm_closes_sockets_with_1001_and_clients_resume_elsewhere(
    settings: Settings,
) -> None:
    a, b = Service("services.table", settings), Service("services.table", settings)
    try:
        await asyncio.gather(a.ready(), b.ready())
        tokens = [
            mint(settings.auth_secret, "p-ana", "Ana"),
            mint(settings.auth_secret, "p-bia", "Bia"),
        ]
        async with aiohttp.ClientSession() as session:
            created = await call(session, "POST", f"{a.base}/v1/tables", tokens[0], {})
            table = created["table_id"]
            await call(
                session,
                "POST",
                f"{b.base}/v1/tables/{table}/join",
                tokens[1],
                {"invite_code": created["invite_code"]},
            )
            sockets = [
                await session.ws_connect(f"{a.base}/v1/tables/{table}/ws?token={t}") for t in tokens
            ]
            spectator = await session.ws_connect(f"{a.base}/v1/tables/{table}/ws")
            seen: list[list[int]] = [[], [], []]
            readers = [
                asyncio.create_task(collect(ws, seen[i]))
                for i, ws in enumerate([*sockets, spectator])
            ]
            for _ in range(6):  # moves through the other replica reach a's clients via the broker
                await next_move(session, b.base, table, tokens)
            await asyncio.sleep(1.0)
            a.terminate()
            async with asyncio.timeout(30):
                codes = await asyncio.gather(*readers)
            assert codes == [1001, 1001, 1001]
            # a clean drain, not a crash
            assert await asyncio.to_thread(a.proc.wait, 30) == 0
            for _ in range(4):  # the game goes on at b while the clients reconnect
                await next_move(session, b.base, table, tokens)

            for i, token in enumerate([*tokens, None]):
                last = seen[i][-1] if seen[i] else 0
                query = f"?token={token}" if token else ""
                async with session.ws_connect(f"{b.base}/v1/tables/{table}/ws{query}") as ws:
                    snapshot = (await ws.receive_json())["view"]
                    async with session.get(f"{b.base}/v1/tables/{table}/events?after={last}") as r:
                        caught_up = [e["seq"] for e in await r.json()]
                    seqs = seen[i] + caught_up
                    assert seqs == list(range(seqs[0], seqs[-1] + 1)), "an event was missed"
                    assert snapshot["version"] >= 1
                    assert seqs[-1] >= max(seen[i], default=0)
            final = await call(session, "GET", f"{b.base}/v1/tables/{table}", tokens[0])
            logged = await call(
                session, "GET", f"{b.base}/v1/tables/{table}/events?after=0", tokens[0]
            )
            assert logged[-1]["seq"] == seqs[-1]
            assert final["status"] == "playing"
    finally:
        a.stop()
        b.stop()
