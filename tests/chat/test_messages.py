"""The chat's refusals answer in the asker's language: Brazilian Portuguese for
``Accept-Language: pt-BR``, English without (shared/contracts/messages.py)."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec

from tests.chat.conftest import ChatApi, chat_table
from tests.table.conftest import Api


async def _post(
    chat: ChatApi, table_id: str, token: str, text: str, headers: dict[str, str]
) -> tuple[int, str | None, Any]:
    path = f"/v1/tables/{table_id}/messages"
    headers = {"Authorization": f"Bearer {token}", **headers}
    body = msgspec.json.encode({"text": text})
    async with chat.client.post(path, data=body, headers=headers) as r:
        return r.status, r.headers.get("Content-Language"), await r.json()


async def test_a_chat_refusal_answers_in_the_language_asked(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    too_long = "a" * 501
    status, language, body = await _post(chat, table_id, ana, too_long, {"Accept-Language": "pt"})
    assert (status, language, body["error"]["code"]) == (400, "pt-BR", "invalid_text")
    assert body["error"]["message"] == "uma mensagem tem no máximo 500 caracteres, não 501"
    status, language, body = await _post(chat, table_id, ana, too_long, {})
    assert (status, language, body["error"]["code"]) == (400, "en", "invalid_text")
    assert body["error"]["message"] == "a message has at most 500 characters, not 501"
    status, _, body = await _post(chat, "no-such", ana, "oi", {"Accept-Language": "pt-BR"})
    assert (status, body["error"]["code"]) == (404, "no_such_table")
    assert body["error"]["message"] == "o chat não conhece essa mesa"


async def test_the_chats_answers_are_not_stored(api: Api, chat: ChatApi, chat_db: Any) -> None:
    """The chat's answers say ``Cache-Control: no-store``, as the table's do."""
    table_id, ana, _ = await chat_table(api, chat_db)
    posted = await chat.post(table_id, ana, "oi")
    assert posted.status == 201, posted
    assert posted.headers.get("Cache-Control") == "no-store"
    history = await chat.history(table_id, after=0)
    assert history.status == 200, history
    assert history.headers.get("Cache-Control") == "no-store"
