"""The chat's Authorization header as a hostile client sends it (issue 13, part 5): raw bytes
and non-ASCII answer 401 in the one error shape, never a 500, and post nothing."""

from __future__ import annotations

import asyncpg

from tests.chat.conftest import ChatApi, chat_table
from tests.table.conftest import Api, assert_error
from tests.table.test_tokens import hostile_values, raw_request


async def test_a_raw_byte_or_non_ascii_in_the_bearer_token_is_401(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    target = f"/v1/tables/{table_id}/messages".encode()
    for value in hostile_values(ana.encode()):
        status, error = await raw_request(
            chat, "POST", target, [b"Authorization: " + value], b'{"text": "oi"}'
        )
        assert_error(status, error, 401, "unauthorized", None)
    reply = await chat.history(table_id)
    assert reply.status == 200, reply
    assert reply.body == []
