"""A refusal answers in the asker's language: Brazilian Portuguese for ``Accept-Language:
pt-BR``, English without, the code and rule alike (shared/contracts/messages.py)."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec

from tests.table.conftest import Api, ws_receive, ws_until

PT = {"Accept-Language": "pt-BR,pt;q=0.9,en;q=0.8"}


async def _command(
    api: Api, table_id: str, token: str, language: dict[str, str], **body: Any
) -> tuple[int, str | None, Any]:
    headers = {**api.auth(token), **language}
    path = f"/v1/tables/{table_id}/commands"
    async with api.client.post(path, data=msgspec.json.encode(body), headers=headers) as r:
        return r.status, r.headers.get("Content-Language"), await r.json()


async def test_a_refusal_over_http_answers_in_the_language_asked(
    api: Api, db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await api.table_for_two()
    view = await api.view(table_id)
    version, deciding = view["version"], [ana, bia][view["hand"]["to_act"]]
    stale = version + 5
    asked = {"pt": PT, "en": {}, "fr": {"Accept-Language": "fr"}}
    answers = {
        name: await _command(
            api, table_id, deciding, language, type="pass_upcard", expected_version=stale
        )
        for name, language in asked.items()
    }
    for _, (status, _, body) in answers.items():
        assert status == 409
        assert body["error"]["code"] == "stale_version"
    assert (
        answers["pt"][2]["error"]["message"] == f"a mesa está na versão {version}, não na {stale}"
    )
    assert answers["pt"][1] == "pt-BR"
    english = f"the table is at version {version}, not {stale}"
    assert answers["en"][2]["error"]["message"] == english
    assert answers["en"][1] == "en"
    assert answers["fr"][2]["error"]["message"] == english


async def test_the_shared_refusals_answer_in_the_language_asked(api: Api) -> None:
    async with api.client.get("/v1/tables/x", headers=PT) as r:
        body = await r.json()
    assert r.status == 404
    assert body["error"] == {
        "code": "no_such_table",
        "message": "essa mesa não existe",
        "rule": None,
    }
    async with api.client.get("/v1/nowhere", headers=PT) as r:
        body = await r.json()
    assert (r.status, body["error"]["code"]) == (404, "no_such_route")
    assert body["error"]["message"] == "não existe essa rota"
    async with api.client.post("/v1/tables", data=b"{", headers=PT) as r:
        body = await r.json()
    assert r.status in (400, 401)
    assert body["error"]["message"].startswith(("o ", "esta "))


async def test_a_refusal_on_the_socket_answers_in_the_upgrade_requests_language(
    api: Api, db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await api.table_for_two()
    waiting = [ana, bia][1 - (await api.view(table_id))["hand"]["to_act"]]
    path = f"/v1/tables/{table_id}/ws?token={waiting}"
    for headers, message in ((PT, "não é a sua vez"), ({}, "it is not your turn")):
        async with api.client.ws_connect(path, headers=headers) as ws:
            assert (await ws_receive(ws))["kind"] == "snapshot"
            await ws.send_json({"kind": "command", "command": {"type": "pass_upcard"}})
            reply = await ws_until(ws, lambda ms: any(m["kind"] == "error" for m in ms))
            error = next(m["error"] for m in reply if m["kind"] == "error")
            assert (error["code"], error["message"]) == ("not_your_turn", message)
