"""Limits of the table service (issue 13, part 3): per-identity rate limits valid across
replicas, and a busy or slow database answered 503 with Retry-After, never a hang."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import asyncpg
import msgspec
import yaml
from aiohttp.test_utils import TestClient

from services.table.http import LIMITS, WRITE_LIMITS
from shared.infra.ratelimit import RateLimiter
from shared.infra.service import POOL
from shared.infra.settings import Settings
from tests.e2e.processes import ROOT
from tests.table.conftest import Api, all_events, assert_error, open_api


async def answer(api: Api, method: str, path: str, token: str, body: Any) -> tuple[int, Any, Any]:
    """Status, JSON body and headers of one request."""
    async with api.client.request(
        method, path, data=msgspec.json.encode(body), headers=api.auth(token)
    ) as r:
        return r.status, msgspec.json.decode(await r.read()), r.headers


def app_of(api: Api) -> Any:
    client: TestClient = api.client
    return client.app


PLAIN_MOVES = ("pass_upcard", "take_upcard", "draw", "discard")


def limited(settings: Settings, **limits: Any) -> Settings:
    return msgspec.structs.replace(settings, **limits)


async def test_commands_past_the_limit_answer_429_with_retry_after_and_change_nothing(
    settings: Settings,
) -> None:
    async with open_api(limited(settings, rate_commands=4, rate_commands_window_s=60.0)) as api:
        table_id, ana, bia = await api.table_for_two()
        path = f"/v1/tables/{table_id}/commands"
        caio = api.token("Caio")  # a spectator: each of his commands is refused (403) ...
        for _ in range(4):
            status, body, _ = await answer(api, "POST", path, caio, {"type": "resign"})
            assert_error(status, body, 403, "not_seated", "R10.1")
        # ... and counted: the fifth is not even looked at.
        before = await all_events(api, table_id)
        status, body, headers = await answer(api, "POST", path, caio, {"type": "resign"})
        assert_error(status, body, 429, "rate_limited", None)
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert await all_events(api, table_id) == before
        # Another identity has its own count.
        view = await api.view(table_id, ana)
        seat = view["hand"]["to_act"]
        status, body = await api.command(table_id, [ana, bia][seat], type="pass_upcard")
        assert status == 200, body


async def test_a_limit_holds_across_replicas(settings: Settings) -> None:
    s = limited(settings, rate_commands=6, rate_commands_window_s=3600.0, rate_sync_s=3600.0)
    async with open_api(s) as one, open_api(s) as two:
        table_id, _, _ = await one.table_for_two()
        path = f"/v1/tables/{table_id}/commands"
        caio = one.token("Caio")
        for _ in range(4):  # four at one replica
            status, _, _ = await answer(one, "POST", path, caio, {"type": "resign"})
            assert status == 403
        # Each replica shares its counts (here by hand: the interval is an hour).
        await app_of(one)[LIMITS].sync()
        await app_of(two)[LIMITS].sync()
        statuses = [
            (await answer(two, "POST", path, caio, {"type": "resign"}))[0] for _ in range(4)
        ]
        assert statuses == [403, 403, 429, 429]  # the other replica allowed only the rest


async def test_table_creation_and_joins_are_limited(settings: Settings) -> None:
    s = limited(settings, rate_tables=2, rate_joins=1, rate_joins_window_s=60.0)
    async with open_api(s) as api:
        ana, bia = api.token("Ana"), api.token("Bia")
        created = [await api.create(ana) for _ in range(2)]
        status, body, headers = await answer(api, "POST", "/v1/tables", ana, {})
        assert_error(status, body, 429, "rate_limited", None)
        assert int(headers["Retry-After"]) >= 1
        code = {"invite_code": "wrong-code-wrong-code1"}
        first = f"/v1/tables/{created[0]['table_id']}/join"
        status, body, _ = await answer(api, "POST", first, bia, code)
        assert_error(status, body, 403, "bad_invite_code", None)
        good = {"invite_code": created[1]["invite_code"]}
        second = f"/v1/tables/{created[1]['table_id']}/join"
        status, body, _ = await answer(api, "POST", second, bia, good)
        assert_error(status, body, 429, "rate_limited", None)
        assert (await api.view(created[1]["table_id"]))["status"] == "waiting"


async def test_an_exhausted_pool_answers_503_with_retry_after_not_a_hang(
    settings: Settings,
) -> None:
    s = limited(settings, db_pool_size=3, db_acquire_timeout_s=0.3)
    async with open_api(s) as api:
        table_id, ana, _ = await api.table_for_two()
        pool: asyncpg.Pool = app_of(api)[POOL]
        held = []
        try:
            while len(held) < 3:  # every connection but the relay's own, then the relay's
                try:
                    held.append(await pool.acquire(timeout=0.5))
                except TimeoutError:
                    break
            async with asyncio.timeout(10):  # never a hang
                status, body, headers = await answer(
                    api, "GET", f"/v1/tables/{table_id}", ana, None
                )
            assert_error(status, body, 503, "busy", None)
            assert headers["Retry-After"] == "1"
        finally:
            for conn in held:
                await pool.release(conn)
        status, _, _ = await answer(api, "GET", f"/v1/tables/{table_id}", ana, None)
        assert status == 200


async def test_a_statement_past_its_timeout_answers_503_and_changes_nothing(
    settings: Settings,
) -> None:
    s = limited(settings, db_statement_timeout_s=0.3)
    async with open_api(s) as api:
        table_id, ana, bia = await api.table_for_two()
        tokens = [ana, bia]
        seat = (await api.view(table_id))["hand"]["to_act"]
        before = await all_events(api, table_id)
        # Someone else holds the table's row lock: the command's lock wait is cancelled.
        conn = await asyncpg.connect(s.database_url)
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT 1 FROM gin_table.tables WHERE table_id = $1 FOR UPDATE", table_id
                )
                path = f"/v1/tables/{table_id}/commands"
                status, body, headers = await answer(
                    api, "POST", path, tokens[seat], {"type": "pass_upcard", "command_id": "p1"}
                )
        finally:
            await conn.close()
        assert_error(status, body, 503, "busy", None)
        assert headers["Retry-After"] == "1"
        assert await all_events(api, table_id) == before
        # The retry, with the same command_id, is applied once.
        status, body = await api.command(
            table_id, tokens[seat], type="pass_upcard", command_id="p1"
        )
        assert status == 200, body


async def test_seat_spectator_and_invitation_refusals_come_before_the_row_lock(
    settings: Settings,
) -> None:
    """With someone else holding a table's row lock, a command that needs the lock answers
    503 after the statement timeout; a wrong invitation code, a bot seated by someone who did
    not create the table and a spectator's command are refused without waiting for it, at the
    replica that saw the table and at one that never did."""
    s = limited(settings, db_statement_timeout_s=0.3)
    async with open_api(s) as api, open_api(s) as other:
        ana = api.token("Ana")
        waiting = (await api.create(ana))["table_id"]
        full, creator, joiner = await api.table_for_two()
        seat = (await api.view(full))["hand"]["to_act"]
        caio = api.token("Caio")
        conn = await asyncpg.connect(s.database_url)
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT 1 FROM gin_table.tables WHERE table_id = ANY($1::text[]) FOR UPDATE",
                    [waiting, full],
                )
                join = f"/v1/tables/{waiting}/join"
                bot = f"/v1/tables/{waiting}/bot"
                for replica in (api, other):
                    status, body, _ = await answer(
                        replica, "POST", join, caio, {"invite_code": "wrong-code-wrong-code1"}
                    )
                    assert_error(status, body, 403, "bad_invite_code", None)
                    status, body, _ = await answer(replica, "POST", bot, caio, {"level": "tito"})
                    assert_error(status, body, 403, "not_creator", "R10.1")
                    for table_id in (waiting, full):
                        path = f"/v1/tables/{table_id}/commands"
                        status, body, _ = await answer(
                            replica, "POST", path, caio, {"type": "resign"}
                        )
                        assert_error(status, body, 403, "not_seated", "R10.1")
                path = f"/v1/tables/{full}/commands"
                seated = [creator, joiner][seat]
                status, body, _ = await answer(api, "POST", path, seated, {"type": "pass_upcard"})
                assert_error(status, body, 503, "busy", None)  # the lock is really held
        finally:
            await conn.close()
        assert (await api.view(waiting))["status"] == "waiting"


async def test_websocket_connections_are_limited_per_identity(settings: Settings) -> None:
    async with open_api(limited(settings, rate_sockets=2)) as api:
        table_id, ana, _ = await api.table_for_two()
        path = f"/v1/tables/{table_id}/ws?token={ana}"
        sockets = [await api.client.ws_connect(path) for _ in range(2)]
        try:
            async with api.client.get(path) as r:  # the third: refused before the upgrade
                assert r.status == 429
                assert int(r.headers["Retry-After"]) >= 1
                assert_error(r.status, await r.json(), 429, "rate_limited", None)
            async with api.client.ws_connect(f"/v1/tables/{table_id}/ws") as anonymous:
                assert (await anonymous.receive_json())["kind"] == "snapshot"
        finally:
            for ws in sockets:
                await ws.close()


async def test_a_spectator_at_a_known_table_is_refused_without_a_connection(
    settings: Settings,
) -> None:
    """Once a replica has seen a full table, a spectator's command is refused from memory:
    with every connection of the pool held, it still answers 403, not 503."""
    s = limited(settings, db_pool_size=3, db_acquire_timeout_s=0.3)
    async with open_api(s) as api:
        table_id, ana, bia = await api.table_for_two()
        seat = (await api.view(table_id))["hand"]["to_act"]
        status, body = await api.command(table_id, [ana, bia][seat], type="pass_upcard")
        assert status == 200, body  # the replica has read the full seating under the lock
        pool: asyncpg.Pool = app_of(api)[POOL]
        held = []
        try:
            while len(held) < 3:
                try:
                    held.append(await pool.acquire(timeout=0.5))
                except TimeoutError:
                    break
            path = f"/v1/tables/{table_id}/commands"
            status, body, _ = await answer(api, "POST", path, api.token("Caio"), {"type": "resign"})
            assert_error(status, body, 403, "not_seated", "R10.1")
            status, body, _ = await answer(api, "POST", path, ana, {"type": "resign"})
            assert_error(status, body, 503, "busy", None)  # a seated player needs the table
        finally:
            for conn in held:
                await pool.release(conn)


async def test_a_flooders_refusals_are_held_back_and_answered_when_the_replica_stops(
    settings: Settings,
) -> None:
    """Past its limit a spectator's commands are answered one per hold interval, however
    many it sends at once; the ones still held when the replica stops are answered 429 then,
    and the stop does not wait out their turn."""
    s = limited(
        settings,
        rate_commands=1,
        rate_commands_window_s=3600.0,  # a minute's window could end mid-test (a flaky 403)
        rate_hold_interval_s=0.05,
        rate_hold_max_s=7200.0,
    )
    api_cm = open_api(s)
    api = await api_cm.__aenter__()
    try:
        table_id, _, _ = await api.table_for_two()
        path = f"/v1/tables/{table_id}/commands"
        caio = api.token("Caio", sub=f"caio-{uuid.uuid4().hex}")  # counts of its own
        status, body, _ = await answer(api, "POST", path, caio, {"type": "resign"})
        assert_error(status, body, 403, "not_seated", "R10.1")
        flood = [
            asyncio.create_task(answer(api, "POST", path, caio, {"type": "resign"}))
            for _ in range(8)
        ]
        done, _ = await asyncio.wait(flood, timeout=0.3)  # 7 × 50 ms are needed for all 8
        assert 1 <= len(done) < 8
        for task in done:
            assert_error(task.result()[0], task.result()[1], 429, "rate_limited", None)
        await asyncio.wait(flood)
        app_of(api)[LIMITS].holds.interval_s = 3600.0  # the one after the next waits an hour
        status, body, _ = await answer(api, "POST", path, caio, {"type": "resign"})
        assert_error(status, body, 429, "rate_limited", None)
        # From a session of its own: the test client's session closes before its server.
        session = aiohttp.ClientSession()
        late = asyncio.create_task(
            session.post(api.client.make_url(path), json={"type": "resign"}, headers=api.auth(caio))
        )
        await asyncio.sleep(0.2)
        assert not late.done()
    finally:
        async with asyncio.timeout(10):
            await api_cm.__aexit__(None, None, None)
    async with session, await late as r:
        assert_error(r.status, await r.json(), 429, "rate_limited", None)
        assert int(r.headers["Retry-After"]) >= 1


async def test_a_flooder_that_leaves_takes_its_held_refusals_with_it(settings: Settings) -> None:
    """A crowded identity's holds last longer (here the tenth some 3 s), but not past its
    client: once the flooder's connections close, every hold of its ends within a hold's
    ``max_s``, so a flooder that reconnects cannot fill the holds with its ghosts."""
    s = limited(
        settings,
        rate_commands=1,
        rate_commands_window_s=3600.0,
        rate_hold_interval_s=3600.0,
        rate_hold_max_s=0.3,
        rate_hold_crowd=1,
    )
    async with open_api(s) as api:
        table_id, _, _ = await api.table_for_two()
        path = f"/v1/tables/{table_id}/commands"
        caio = api.token("Caio", sub=f"caio-{uuid.uuid4().hex}")  # counts of its own
        for code in ("not_seated", "rate_limited"):  # its first refusal is answered at once
            _, body, _ = await answer(api, "POST", path, caio, {"type": "resign"})
            assert body["error"]["code"] == code, body
        holds = app_of(api)[LIMITS].holds
        session = aiohttp.ClientSession()
        url = api.client.make_url(path)
        flood = [
            asyncio.create_task(session.post(url, json={"type": "resign"}, headers=api.auth(caio)))
            for _ in range(10)
        ]
        async with asyncio.timeout(5):
            while holds.held < 10:
                await asyncio.sleep(0.01)
        for task in flood:
            task.cancel()
        await session.close()  # the flooder leaves
        left = asyncio.get_running_loop().time()
        async with asyncio.timeout(5):
            while holds.held:
                await asyncio.sleep(0.01)
        assert asyncio.get_running_loop().time() - left < 0.3 * 2  # not the tenth's ~3 s


async def test_refused_commands_have_a_limit_of_their_own_over_http_and_the_socket(
    settings: Settings,
) -> None:
    """Commands refused for what they are (a spectator's, a malformed one) count against
    ``refusals``, far below the commands limit: past it they answer 429, on either route,
    while the seated players' moves, never refused, are not counted."""
    s = limited(settings, rate_refusals=3, rate_commands=1000, rate_hold_interval_s=0.0)
    async with open_api(s) as api:
        table_id, ana, bia = await api.table_for_two()
        path = f"/v1/tables/{table_id}/commands"
        caio = api.token("Caio")
        status, body, _ = await answer(api, "POST", path, caio, {"type": "resign"})
        assert_error(status, body, 403, "not_seated", "R10.1")
        status, body, _ = await answer(api, "POST", path, caio, {"type": "fly"})
        assert_error(status, body, 400, "unknown_command", None)
        async with api.client.post(path, data=b"{", headers=api.auth(caio)) as r:
            assert_error(r.status, await r.json(), 400, "malformed_json", None)
        before = await all_events(api, table_id)
        status, body, headers = await answer(api, "POST", path, caio, {"type": "resign"})
        assert_error(status, body, 429, "rate_limited", None)
        assert int(headers["Retry-After"]) >= 1
        async with api.client.ws_connect(f"/v1/tables/{table_id}/ws?token={caio}") as ws:
            assert (await ws.receive_json())["kind"] == "snapshot"
            await ws.send_json({"command": {"type": "resign"}})
            reply = await ws.receive_json()
            assert reply["kind"] == "error"
            assert reply["error"]["code"] == "rate_limited"
        assert await all_events(api, table_id) == before
        for _ in range(5):  # the players' accepted moves are never refusals
            seat = (await api.view(table_id))["hand"]["to_act"]
            view = await api.view(table_id, [ana, bia][seat])
            move = next(m for m in view["legal"] if m["type"] in PLAIN_MOVES)
            status, body = await api.command(table_id, [ana, bia][seat], **move)
            assert status == 200, body


def test_every_writing_route_of_the_api_has_a_per_identity_limit() -> None:
    """Issue 31, part 3: each route of docs/openapi.yaml that writes (POST, PUT, PATCH,
    DELETE) is in the table service's ``WRITE_LIMITS`` with a limit the rate limiter knows,
    or is the chat's message route (its own per-player rate, services/chat/rules.py); the
    only route without one writes nothing."""
    document = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
    known = set(RateLimiter.from_settings(None, Settings()).limits)  # type: ignore[arg-type]
    chat = {("POST", "/v1/tables/{id}/messages")}
    writing = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
        if method in ("post", "put", "patch", "delete")
    }
    assert writing, "no writing route found: the document's shape changed"
    missing = writing - set(WRITE_LIMITS) - chat
    assert not missing, f"writing routes without a limit: {sorted(missing)}"
    for route, action in WRITE_LIMITS.items():
        assert route in writing, f"{route} is not in docs/openapi.yaml"
        assert action is None or action in known, (route, action)
    assert [r for r, a in WRITE_LIMITS.items() if a is None] == [("POST", "/v1/dev/tokens")]


async def test_bot_seating_and_preferences_are_limited(settings: Settings) -> None:
    s = limited(settings, rate_joins=1, rate_preferences=2, rate_preferences_window_s=60.0)
    async with open_api(s) as api:
        ana = api.token("Ana", f"limited-{uuid.uuid4().hex}")  # a design of her own
        tables = [(await api.create(ana))["table_id"] for _ in range(2)]
        status, body, _ = await answer(
            api, "POST", f"/v1/tables/{tables[0]}/bot", ana, {"level": "tito"}
        )
        assert status == 200, body
        status, body, headers = await answer(
            api, "POST", f"/v1/tables/{tables[1]}/bot", ana, {"level": "tito"}
        )
        assert_error(status, body, 429, "rate_limited", None)
        assert int(headers["Retry-After"]) >= 1
        assert (await api.view(tables[1]))["status"] == "waiting"  # nothing changed
        path = "/v1/players/me/preferences"
        for design in ("classic", "azul"):
            status, body, _ = await answer(api, "PUT", path, ana, {"deck_design": design})
            assert status == 200, body
        status, body, _ = await answer(api, "PUT", path, ana, {"deck_design": "classic"})
        assert_error(status, body, 429, "rate_limited", None)
        status, body, _ = await answer(api, "GET", path, ana, None)
        assert body["deck_design"] == "azul"  # the refused change changed nothing
