"""What a hostile client sends (issue 13, part 1): each answered with a 4xx in the one error
shape, never a 500, and nothing changed. The first six are the inputs that answered 500."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec
import pytest

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.table.conftest import Api, assert_error
from tests.table.test_bad_input import state_of


@pytest.fixture
async def seated(api: Api) -> tuple[str, list[str], str]:
    """A table with both seats taken: its id, the seats' tokens, its invitation code."""
    ana, bia = api.token("Ana"), api.token("Bia")
    created = await api.create(ana)
    path = f"/v1/tables/{created['table_id']}/join"
    status, body = await api.call("POST", path, bia, {"invite_code": created["invite_code"]})
    assert status == 200, body
    return created["table_id"], [ana, bia], created["invite_code"]


async def raw_call(
    api: Api, method: str, path: str, token: str | None, body: bytes | None = None
) -> tuple[int, Any]:
    """A request whose path is sent as written (percent escapes included)."""
    url = api.client.make_url("/").with_path(path, encoded=True)
    async with api.client.session.request(method, url, data=body, headers=api.auth(token)) as r:
        text = await r.read()
        return r.status, msgspec.json.decode(text) if text else None


async def test_a_non_ascii_invitation_code_is_400(
    api: Api, db: asyncpg.Connection, seated: tuple[str, list[str], str]
) -> None:
    table_id, tokens, _ = seated
    caio = api.token("Caio")
    before = await state_of(api, db, table_id, tokens)
    for code in ("çódigo-de-convite", "\u0000" * 22, "a" * 65, "", "abc\n"):
        status, body = await api.call(
            "POST", f"/v1/tables/{table_id}/join", caio, {"invite_code": code}
        )
        assert_error(status, body, 400, "invalid_request", None)
    assert await state_of(api, db, table_id, tokens) == before


@pytest.mark.parametrize(
    "query",
    ["after=9223372036854775808", "after=99999999999999999999999", "limit=1e3", "after=%D9%A3"],
)
async def test_after_and_limit_beyond_their_columns_are_400(
    api: Api, seated: tuple[str, list[str], str], query: str
) -> None:
    table_id = seated[0]
    status, body = await raw_call(api, "GET", f"/v1/tables/{table_id}/events?{query}", None)
    assert_error(status, body, 400, "invalid_request", None)
    status, body = await api.call("GET", f"/v1/tables/{table_id}/events?after=9223372036854775807")
    assert (status, body) == (200, [])  # the largest bigint is a position like any other


@pytest.mark.parametrize(
    "number", ["2147483648", "99999999999999999999", "0", "-1", "1_0", "%D9%A3"]
)
async def test_a_hand_number_beyond_an_integer_is_400(
    api: Api, seated: tuple[str, list[str], str], number: str
) -> None:
    status, body = await raw_call(api, "GET", f"/v1/tables/{seated[0]}/hands/{number}", None)
    assert_error(status, body, 400, "invalid_request", None)


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ""), ("GET", "/events"), ("POST", "/commands"), ("POST", "/join"), ("GET", "/ws")],
)
async def test_a_nul_or_a_foreign_character_in_a_table_id_is_400(
    api: Api, seated: tuple[str, list[str], str], method: str, suffix: str
) -> None:
    token = seated[1][0]
    for table_id in ("abc%00def", "%C3%A7%C3%A3o", "a" * 65, "x%0A"):
        status, body = await raw_call(api, method, f"/v1/tables/{table_id}{suffix}", token, b"{}")
        assert_error(status, body, 400, "invalid_table_id", None)


async def test_a_nul_in_a_command_id_is_400_and_changes_nothing(
    api: Api, db: asyncpg.Connection, seated: tuple[str, list[str], str]
) -> None:
    table_id, tokens, _ = seated
    seat = (await api.view(table_id))["hand"]["to_act"]
    before = await state_of(api, db, table_id, tokens)
    for command_id in ("a\u0000b", "é", "a b", "x" * 101, "ok\n"):
        status, body = await api.command(
            table_id, tokens[seat], type="pass_upcard", command_id=command_id
        )
        assert_error(status, body, 400, "invalid_request", None)
    assert await state_of(api, db, table_id, tokens) == before


async def test_a_body_over_the_limit_is_413_and_changes_nothing(
    api: Api, db: asyncpg.Connection, seated: tuple[str, list[str], str], settings: Settings
) -> None:
    table_id, tokens, _ = seated
    seat = (await api.view(table_id))["hand"]["to_act"]
    before = await state_of(api, db, table_id, tokens)
    padding = " " * settings.max_body_bytes
    big = b'{"type": "pass_upcard"%s}' % padding.encode()
    status, body = await api.call("POST", f"/v1/tables/{table_id}/commands", tokens[seat], raw=big)
    assert_error(status, body, 413, "body_too_large", None)
    assert await state_of(api, db, table_id, tokens) == before


async def test_a_query_token_is_not_a_credential_on_http_routes(
    api: Api, seated: tuple[str, list[str], str]
) -> None:
    table_id, tokens, _ = seated
    status, body = await api.call("POST", f"/v1/tables?token={tokens[0]}", None, {})
    assert_error(status, body, 401, "unauthorized", None)
    status, body = await api.call("GET", f"/v1/tables/{table_id}?token={tokens[0]}")
    assert status == 200
    assert body["you"] is None  # the public view: the token in the URL was not read


async def test_a_development_token_with_a_control_character_is_refused(api: Api) -> None:
    for body in ({"name": "Ana\u0000"}, {"name": "Ana\n"}, {"name": "Ana", "sub": "a\u0000"}):
        status, answer = await api.call("POST", "/v1/dev/tokens", None, body)
        assert_error(status, answer, 400, "invalid_request", None)


async def test_a_signed_token_whose_subject_has_a_nul_is_401_not_500(
    api: Api, settings: Settings
) -> None:
    token = mint(settings.auth_secret, "ana\u0000", "Ana")
    status, body = await api.call("POST", "/v1/tables", token, {})
    assert_error(status, body, 401, "unauthorized", None)
