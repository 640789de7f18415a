"""Read-your-writes in chat (issue 15, part 8): a person who writes right after taking a seat,
saying which table version they have seen (``after_version``), is accepted once the chat has
caught up, and never refused as a spectator; past the bound the answer is 503 with
``Retry-After``. Real table and chat services, PostgreSQL and RabbitMQ.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from services.chat.http import CATCH_UP_S
from tests.chat.conftest import ChatApi, chat_table, learned, person
from tests.table.conftest import Api, assert_error

N = 20


async def post(chat: ChatApi, table_id: str, token: str, text: str, after: object) -> tuple:
    reply = await chat.call(
        "POST", f"/v1/tables/{table_id}/messages", token, {"text": text, "after_version": after}
    )
    return reply.status, reply.body


async def test_20_of_20_messages_right_after_a_join_are_accepted(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    async def join_and_write(i: int) -> tuple[int, int]:
        ana, bia = person(api, "Ana"), person(api, "Bia")
        created = await api.create(ana)
        table_id = created["table_id"]
        # The creator at once, before the chat has heard of the table at all...
        first = await post(chat, table_id, ana, f"oi {i}", created["view"]["version"])
        status, joined = await api.call(
            "POST", f"/v1/tables/{table_id}/join", bia, {"invite_code": created["invite_code"]}
        )
        assert status == 200, joined
        # ...and the one who just joined, the moment the join answered.
        second = await post(chat, table_id, bia, f"olá {i}", joined["view"]["version"])
        return first, second

    answers = await asyncio.gather(*(join_and_write(i) for i in range(N)))
    assert [(a[0], b[0]) for a, b in answers] == [(201, 201)] * N, answers


async def test_without_after_version_the_chat_answers_from_what_it_knows(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    """The old behaviour is kept: no waiting (a client that does not send the version)."""
    table_id, ana, _ = await chat_table(api, chat_db)
    status, body = await post(chat, table_id, ana, "oi", None)
    assert status == 201, body
    stranger = person(api, "Caio")
    started = time.monotonic()
    status, body = await post(chat, table_id, stranger, "oi", None)
    assert_error(status, body, 403, "spectators_cannot_chat", "R10.5")
    assert time.monotonic() - started < 1.0


async def test_a_spectator_with_after_version_is_refused_without_waiting_once_seats_are_known(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    version = (await api.view(table_id, ana))["version"]
    stranger = person(api, "Caio")
    started = time.monotonic()
    status, body = await post(chat, table_id, stranger, "oi", version + 1000)
    assert_error(status, body, 403, "spectators_cannot_chat", "R10.5")  # both seats taken
    assert time.monotonic() - started < 1.0


async def test_a_spectator_at_a_waiting_table_is_refused_once_the_chat_caught_up(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    ana = person(api, "Ana")
    created = await api.create(ana)
    table_id, version = created["table_id"], created["view"]["version"]
    stranger = person(api, "Caio")
    status, body = await post(chat, table_id, stranger, "oi", version)
    assert_error(status, body, 403, "spectators_cannot_chat", "R10.5")


async def test_past_the_bound_the_answer_is_503_with_retry_after_and_nothing_changes(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    ana = person(api, "Ana")
    created = await api.create(ana)
    table_id, version = created["table_id"], created["view"]["version"]
    await learned(chat_db, table_id, seats=1)
    stranger = person(api, "Caio")
    started = time.monotonic()
    status, body = await post(chat, table_id, stranger, "oi", version + 5)  # not yet happened
    waited = time.monotonic() - started
    assert_error(status, body, 503, "chat_catching_up", None)
    assert CATCH_UP_S - 0.1 <= waited < CATCH_UP_S + 1.5, waited
    reply = await chat.call("POST", f"/v1/tables/{table_id}/messages", stranger, {"text": "x"})
    assert reply.status == 403
    assert await chat.all_messages(table_id) == []
    # and a table the chat never hears of: 503 too (it may not have heard yet), then 404
    status, body = await post(chat, "no-such-table", stranger, "oi", 1)
    assert_error(status, body, 503, "chat_catching_up", None)
    status, body = await post(chat, "no-such-table", stranger, "oi", None)
    assert_error(status, body, 404, "no_such_table", None)


async def test_503_carries_retry_after(api: Api, chat: ChatApi) -> None:
    stranger = person(api, "Caio")
    reply = await chat.call(
        "POST", "/v1/tables/nowhere/messages", stranger, {"text": "oi", "after_version": 3}
    )
    assert reply.status == 503
    assert reply.headers["Retry-After"] == "1"


@pytest.mark.parametrize("after", [-1, "3", 2**31, 1.5, True])
async def test_a_bad_after_version_is_400_and_changes_nothing(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection, after: object
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    status, body = await post(chat, table_id, ana, "oi", after)
    assert status == 400, body
    assert set(body) == {"error"}
    assert await chat.all_messages(table_id) == []
