"""Erasure on request (issue 32 part 4) in the chat: on ``player_erased`` the person's messages
at that table are deleted (with their outbox rows) and their seat shows the pseudonym, in the
transaction that records the event; the others' messages stay."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import msgspec

from services.table.erasure import ERASED_NAME
from shared.infra.settings import Settings
from tests.chat.conftest import ChatApi, learned
from tests.table.conftest import Api, open_api
from tests.table.test_erasure import QUIET, erase, gone_from, places_holding, who


async def seated(api: Api, chat_db: asyncpg.Connection, creator: str, joiner: str) -> str:
    """A table of two, known to the chat."""
    created = await api.create(creator)
    table_id: str = created["table_id"]
    status, body = await api.call(
        "POST", f"/v1/tables/{table_id}/join", joiner, {"invite_code": created["invite_code"]}
    )
    assert status == 200, body
    await learned(chat_db, table_id)
    return table_id


async def erased_at(chat_db: asyncpg.Connection, *table_ids: str, within_s: float = 10.0) -> None:
    """Wait until the chat has applied ``player_erased`` at each table."""
    deadline = asyncio.get_running_loop().time() + within_s
    query = (
        "SELECT count(DISTINCT table_id) FROM applied_events"
        " WHERE table_id = ANY($1::text[]) AND type = 'player_erased'"
    )
    while await chat_db.fetchval(query, list(table_ids)) < len(table_ids):
        assert asyncio.get_running_loop().time() < deadline, "the chat did not erase"
        await asyncio.sleep(0.02)


def texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["data"]["name"], m["data"]["text"]) for m in messages]


async def test_the_erased_persons_messages_are_deleted_and_the_others_kept(
    settings: Settings, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    async with open_api(msgspec.structs.replace(settings, **QUIET)) as api:
        await erasure_in_the_chat(api, chat, chat_db)


async def erasure_in_the_chat(api: Api, chat: ChatApi, chat_db: asyncpg.Connection) -> None:
    """Ana chats at two tables, Bia and Caio at those and one of their own; Ana is erased."""
    ana_sub, ana_name = who("Ana")
    bia_sub, bia_name = who("Bia")
    caio_sub, caio_name = who("Caio")
    ana = api.token(ana_name, ana_sub)
    bia = api.token(bia_name, bia_sub)
    caio = api.token(caio_name, caio_sub)
    first = await seated(api, chat_db, ana, bia)
    second = await seated(api, chat_db, caio, ana)
    theirs = await seated(api, chat_db, bia, caio)
    secret = f"segredo da {ana_name}"
    await chat.say(first, ana, "oi, bom jogo!")
    kept = await chat.say(first, bia, "igualmente")
    await chat.say(first, ana, secret)
    await chat.say(second, caio, "vamos?")
    await chat.say(second, ana, secret)
    untouched = await chat.all_messages(theirs) + [await chat.say(theirs, bia, "e aí, Caio")]
    assert await places_holding(chat_db, "gin_chat", ana_sub, ana_name, secret)

    assert await erase(api, ana) == 204
    await erased_at(chat_db, first, second)

    assert await places_holding(chat_db, "gin_chat", ana_sub, ana_name, secret) == []
    await gone_from(chat_db, "gin_table", ana_sub, ana_name)
    assert await chat.all_messages(first) == [kept]  # Bia's, byte for byte as published
    assert texts(await chat.all_messages(second)) == [(caio_name, "vamos?")]
    assert await chat.all_messages(theirs) == untouched
    seats = await chat_db.fetch(
        "SELECT table_id, seat, player_id, name FROM seats"
        " WHERE table_id = ANY($1::text[]) ORDER BY table_id, seat",
        [first, second],
    )
    erased = [(r["table_id"], r["seat"]) for r in seats if r["name"] == ERASED_NAME]
    assert sorted(erased) == sorted([(first, 0), (second, 1)])
    assert all(r["player_id"].startswith("erased-") for r in seats if r["name"] == ERASED_NAME)
    # The numbers of deleted messages are not given again: the chat stream never reuses one.
    assert await chat_db.fetchval("SELECT last_message FROM tables WHERE table_id = $1", first) == 3

    # Ana's token still works, but she sits nowhere now: she writes nowhere.
    reply = await chat.post(first, ana, "ainda aqui?")
    assert reply.status in (403, 409), reply
    # A second erasure changes nothing in the chat either.
    assert await erase(api, ana) == 204
    await asyncio.sleep(0.5)
    assert await chat.all_messages(first) == [kept]
    assert (
        await chat_db.fetchval(
            "SELECT count(*) FROM applied_events WHERE table_id = $1 AND type = 'player_erased'",
            first,
        )
        == 1
    )
