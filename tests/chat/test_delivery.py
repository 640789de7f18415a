"""A message goes out on ``gin.events`` through the chat's outbox, and the table service's
WebSocket delivers it live to everyone at the table: a client keeps one socket."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import asyncpg

from shared.contracts.names import EVENTS_EXCHANGE, chat_key
from tests.chat.conftest import ChatApi, chat_table
from tests.table.conftest import Api, Tap, ws_receive, ws_until


def ws_path(table_id: str, token: str | None = None) -> str:
    return f"/v1/tables/{table_id}/ws" + (f"?token={token}" if token else "")


def chat_events(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        m["event"]
        for m in messages
        if m["kind"] == "event" and m["event"]["type"] == "message_posted"
    ]


def heard(count: int) -> Any:
    return lambda messages: len(chat_events(messages)) >= count


async def silent(ws: aiohttp.ClientWebSocketResponse, quiet_s: float = 0.3) -> None:
    """Fails if the socket sends anything within ``quiet_s`` seconds."""
    try:
        msg = await asyncio.wait_for(ws.receive(), quiet_s)
    except TimeoutError:
        return
    raise AssertionError(f"an unexpected message: {msg}")


async def test_a_message_reaches_both_players_and_a_spectators_socket(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await chat_table(api, chat_db)
    sockets = [
        await api.client.ws_connect(ws_path(table_id, ana)),
        await api.client.ws_connect(ws_path(table_id, bia)),
        await api.client.ws_connect(ws_path(table_id)),  # a spectator, without a token
    ]
    try:
        for ws in sockets:
            assert (await ws_receive(ws))["kind"] == "snapshot"
        said = [await chat.say(table_id, bia, "oi, Ana!")]
        said += [await chat.say(table_id, ana, "oi, Bia!"), await chat.say(table_id, bia, "👋")]
        for ws in sockets:
            messages = await ws_until(ws, heard(3))
            await silent(ws)  # each message once
            assert [m for m in messages if m["kind"] == "event"] == [
                {"kind": "event", "event": envelope} for envelope in said
            ]
        # The history holds the very envelopes the sockets got.
        assert (await chat.history(table_id)).body == said
    finally:
        for ws in sockets:
            await ws.close()


async def test_each_message_is_published_once_on_the_chat_key(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await chat_table(api, chat_db)
    async with Tap(api.settings, EVENTS_EXCHANGE, chat_key(table_id)) as tap:
        said = [await chat.say(table_id, token, "bom jogo") for token in (ana, bia, ana)]
        bodies = await tap.collect(lambda got: len(got) >= 3)
        assert await tap.drain(0.3) == []
    assert bodies == said
    assert [b["seq"] for b in bodies] == [1, 2, 3]
