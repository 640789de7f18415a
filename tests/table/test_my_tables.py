"""The caller's tables (issue 33, part 1): ``GET /v1/players/me/tables`` against real
PostgreSQL (order, paging while moves happen, fields, status filter, refusals, only one's
own, the plan by index) and the player socket ``GET /v1/players/me/ws`` with the real app."""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import msgspec
import pytest

from services.table import listing
from services.table.erasure import ERASED_NAME
from services.table.http import READ_LIMITS
from services.table.hub import HUB
from services.table.lobby import LOBBY_KEY, RELIST_BATCH
from services.table.ws import CLOSE_TOKEN_EXPIRED, CLOSE_TRY_AGAIN_LATER, TRY_AGAIN_REASON
from shared.infra.auth import mint
from shared.infra.ratelimit import RateLimiter
from shared.infra.settings import Settings
from tests.table.conftest import (
    Api,
    Clock,
    assert_error,
    open_api,
    published,
    ws_receive,
    ws_silent,
    ws_until,
)

NAMES = ("Ana", "Bia", "Caio")  # each test's people are its own: the database is shared
ABSENCE = timedelta(hours=48)
EXPIRY = timedelta(days=7)


def when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


def place(entry: dict[str, Any]) -> tuple[int, datetime, str]:
    """An entry's place in the order: its group, the moment its turn (or last move) began,
    its table id (the service's own order, from what the entry says)."""
    group = 2 if entry["status"] in ("closed", "expired") else 0 if entry["my_turn"] else 1
    since = when(entry["turn_since"])
    if since is None:
        expires = when(entry["expires_at"])
        since = expires - EXPIRY if expires is not None else datetime.min
    return group, since, entry["table_id"]


async def my_tables(api: Api, token: str, query: str = "") -> tuple[int, Any]:
    return await api.call("GET", f"/v1/players/me/tables{query}", token)


async def every_page(api: Api, token: str, query: str = "?limit=2") -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    status, page = await my_tables(api, token, query)
    while True:
        assert status == 200, page
        entries += page["tables"]
        if page["next"] is None:
            return entries
        status, page = await my_tables(api, token, f"{query}&after={page['next']}")


async def move(api: Api, table_id: str, token: str, rng: random.Random) -> None:
    """One legal move (no resign, leave or claim) by the caller, who is to act."""
    view = await api.view(table_id, token)
    legal = [m for m in view["legal"] if m["type"] not in ("resign", "leave", "claim_absence")]
    status, body = await api.command(table_id, token, **rng.choice(legal))
    assert status == 200, body


async def to_act(api: Api, table_id: str) -> int:
    return int((await api.view(table_id))["hand"]["to_act"])


async def table_for(api: Api, first: str, second: str) -> str:
    created = await api.create(first)
    join = {"invite_code": created["invite_code"]}
    status, body = await api.call("POST", f"/v1/tables/{created['table_id']}/join", second, join)
    assert status == 200, body
    return str(created["table_id"])


async def until_turn(api: Api, table_id: str, players: list[str], seat: int) -> None:
    """Whoever is to act moves until ``seat`` has the decision."""
    rng = random.Random(table_id)
    while (acting := await to_act(api, table_id)) != seat:
        await move(api, table_id, players[acting], rng)


async def seat_ana_at_many(api: Api, clock: Clock) -> tuple[str, list[str], dict[str, str]]:
    """Ana at six tables, created a minute apart: four played by Ana and Bia (Ana the creator
    of two, the joiner of two), one waiting for an opponent, one closed; and Bia's table with
    Caio, where Ana only watches. Her token, her open tables, and each table's tokens."""
    ana, bia, caio = (api.token(name, f"{name}-{uuid.uuid4().hex}") for name in NAMES)
    tokens: dict[str, str] = {}
    opened: list[str] = []
    for n in range(4):
        clock.advance(60)
        first, second = (ana, bia) if n % 2 == 0 else (bia, ana)
        created = await api.create(first)
        table_id = created["table_id"]
        status, body = await api.call(
            "POST", f"/v1/tables/{table_id}/join", second, {"invite_code": created["invite_code"]}
        )
        assert status == 200, body
        opened.append(table_id)
        tokens[table_id] = f"{first} {second}"
        # Ana has the decision at tables 0 and 1, Bia at 2 and 3.
        ana_seat = n % 2
        await until_turn(api, table_id, [first, second], ana_seat if n < 2 else 1 - ana_seat)
    clock.advance(60)
    waiting = (await api.create(ana))["table_id"]
    opened.append(waiting)
    clock.advance(60)
    closed = (await api.create(ana))["table_id"]
    status, body = await api.command(closed, ana, command_id="leave-1", type="leave")
    assert status == 200, body
    created = await api.create(bia)
    status, _ = await api.call(
        "POST",
        f"/v1/tables/{created['table_id']}/join",
        caio,
        {"invite_code": created["invite_code"]},
    )
    assert status == 200
    tokens["closed"] = closed
    tokens["strangers"] = created["table_id"]
    return ana, opened, tokens


def seat_tokens(tokens: dict[str, str], table_id: str) -> list[str]:
    return tokens[table_id].split(" ")


async def test_my_tables_are_mine_my_turn_first_then_the_longest_waiting(
    api: Api, clock: Clock
) -> None:
    ana, opened, tokens = await seat_ana_at_many(api, clock)
    async with api.client.ws_connect(f"/v1/tables/{tokens['strangers']}/ws?token={ana}") as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"  # Ana watches: no table of hers
    status, page = await my_tables(api, ana, "?limit=100")
    assert status == 200, page
    assert page["next"] is None
    listed = [e["table_id"] for e in page["tables"]]
    assert sorted(listed) == sorted(opened)  # not the closed one, not the strangers'
    assert tokens["strangers"] not in listed
    assert [place(e) for e in page["tables"]] == sorted(place(e) for e in page["tables"])
    assert any(e["my_turn"] for e in page["tables"])
    assert not page["tables"][-1]["my_turn"]
    for entry in page["tables"]:
        view = await api.view(entry["table_id"], ana)
        assert entry["you"] == view["you"]
        assert entry["status"] == view["status"]
        assert [s and s["name"] for s in entry["seats"]] == [s and s["name"] for s in view["seats"]]
        assert entry["options"] == view["options"]
        assert entry["scores"] == view["match"]["scores"] if view["match"] else [0, 0]
        if view["status"] == "playing":  # R10.2: the decision's seat and its 48 hours
            assert entry["to_act"] == view["hand"]["to_act"]
            assert entry["my_turn"] == (view["hand"]["to_act"] == view["you"])
            assert when(entry["absence_claimable_at"]) == when(entry["turn_since"]) + ABSENCE
        else:
            assert entry["to_act"] is None
            assert entry["turn_since"] is None
            assert not entry["my_turn"]
            assert entry["absence_claimable_at"] is None
        assert entry["expires_at"] is not None  # R10.3: open tables expire
    # Same order page by page as in one page.
    assert [e["table_id"] for e in await every_page(api, ana)] == listed


async def test_paging_while_moves_happen_misses_no_table(api: Api, clock: Clock) -> None:
    """Moves between pages (the clock moving on), at tables sent already and not yet: every
    open table is listed, a table twice only if it changed after it was sent, and the last
    entry of each is its current one. Three pagings, one page of one table at a time."""
    ana, opened, tokens = await seat_ana_at_many(api, clock)
    rng = random.Random(33)
    for _ in range(3):
        status, page = await my_tables(api, ana, "?limit=1")
        assert status == 200, page
        seen = list(page["tables"])
        changed: set[str] = set()
        while page["next"] is not None:
            clock.advance(5)
            for table_id in rng.sample(opened[:4], 2):
                players = seat_tokens(tokens, table_id)
                await move(api, table_id, players[await to_act(api, table_id)], rng)
                changed.add(table_id)
            status, page = await my_tables(api, ana, f"?limit=1&after={page['next']}")
            assert status == 200, page
            seen += page["tables"]
        ids = [e["table_id"] for e in seen]
        assert set(ids) == set(opened)
        assert all(ids.count(t) == 1 or t in changed for t in set(ids))
        status, now = await my_tables(api, ana, "?limit=100")
        last = {e["table_id"]: e for e in seen}
        for entry in now["tables"]:
            was = last[entry["table_id"]]
            assert (was["to_act"], was["turn_since"]) == (entry["to_act"], entry["turn_since"])


async def test_the_status_filter(api: Api, clock: Clock) -> None:
    ana, opened, tokens = await seat_ana_at_many(api, clock)
    finished = await every_page(api, ana, "?status=finished&limit=2")
    assert [(e["table_id"], e["status"]) for e in finished] == [(tokens["closed"], "closed")]
    assert finished[0]["expires_at"] is None
    assert finished[0]["to_act"] is None
    everything = await every_page(api, ana, "?status=all&limit=2")
    assert {e["table_id"] for e in everything} == {*opened, tokens["closed"]}
    assert everything[-1]["table_id"] == tokens["closed"]  # the finished last
    assert {e["table_id"] for e in await every_page(api, ana, "?status=open")} == set(opened)


async def test_an_erased_opponent_shows_as_the_pseudonym(api: Api) -> None:
    ana, bia, _ = (api.token(name, f"{name}-{uuid.uuid4().hex}") for name in NAMES)
    table_id = await table_for(api, ana, bia)
    assert (await api.call("DELETE", "/v1/players/me", bia))[0] == 204
    entries = await every_page(api, ana, "?status=all")
    entry = next(e for e in entries if e["table_id"] == table_id)
    assert entry["seats"][1]["name"] == ERASED_NAME
    assert (await my_tables(api, bia, "?status=all"))[1]["tables"] == []


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("?status=closed", "invalid_list_status"),
        ("?status=", "invalid_list_status"),
        ("?limit=0", "invalid_request"),
        ("?limit=101", "invalid_request"),
        ("?limit=1e3", "invalid_request"),
        ("?after=not-a-cursor", "invalid_cursor"),
        ("?after=%F0%9F%82%A1", "invalid_cursor"),
        ("?after=" + "A" * 500, "invalid_cursor"),
    ],
)
async def test_bad_queries_are_refused(api: Api, query: str, code: str) -> None:
    status, body = await my_tables(api, api.token("Ana", uuid.uuid4().hex), query)
    assert_error(status, body, 400, code, None)


async def test_a_cursor_is_only_its_callers_for_its_status(api: Api, clock: Clock) -> None:
    ana, _, _ = await seat_ana_at_many(api, clock)
    status, page = await my_tables(api, ana, "?limit=1")
    cursor = page["next"]
    assert cursor
    assert (await my_tables(api, ana, f"?limit=1&after={cursor}"))[0] == 200
    forged = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
    for token, query in [
        (ana, f"?after={forged}"),
        (api.token("Eva", uuid.uuid4().hex), f"?after={cursor}"),
        (ana, f"?status=all&after={cursor}"),
    ]:
        status, body = await my_tables(api, token, query)
        assert_error(status, body, 400, "invalid_cursor", None)
    status, body = await my_tables(api, None)  # type: ignore[arg-type]
    assert status == 401, body
    assert (await api.call("GET", "/v1/players/me/tables?status=all", "x.y.z"))[0] == 401


async def test_the_list_is_served_by_indexes(
    api: Api, clock: Clock, db: asyncpg.Connection
) -> None:
    """The plan reads the caller's tables by ``tables_creator`` and ``tables_joiner`` and
    their turns by ``deadlines``' key, and reads no table whole (scans made unattractive, as
    on a large table: a small one is read whole however it is indexed)."""
    ana, _, _ = await seat_ana_at_many(api, clock)
    status, page = await my_tables(api, ana)  # the query takes the token's sub: read it back
    assert status == 200
    view = await api.view(page["tables"][0]["table_id"], ana)
    player = view["seats"][view["you"]]["id"]
    async with db.transaction():
        await db.execute("SET LOCAL enable_seqscan = off")
        # As with many tables a caller's: the planner prefers a hash join then, which reads
        # every row of deadlines; the per-table lookup must not depend on its preference.
        await db.execute("SET LOCAL enable_nestloop = off")
        plan = "\n".join(
            r[0]
            for r in await db.fetch(
                "EXPLAIN " + listing._MINE,
                player,
                list(listing.STATUSES["open"]),
                datetime.now().astimezone(),
                -1,
                0,
                datetime.now().astimezone(),
                "",
                21,
            )
        )
    assert "tables_creator" in plan, plan
    assert "tables_joiner" in plan, plan
    assert "deadlines_pkey" in plan, plan
    assert "Seq Scan" not in plan, plan
    # Each table's turn is looked up by its id, not read for every table of the service and
    # joined (a hash join over a whole-index scan also passes the asserts above).
    lookup = r"deadlines_pkey on deadlines.*\n\s+Index Cond: \(table_id = \w+\.table_id\)"
    assert re.search(lookup, plan), plan


async def test_the_player_socket_tells_of_my_turn_and_not_of_others_tables(
    api: Api, db: asyncpg.Connection, settings: Settings
) -> None:
    """A move by my opponent sends my entry with ``my_turn`` true; a move at a table I do
    not sit at sends me nothing."""
    ana, bia, caio = (api.token(name, f"{name}-{uuid.uuid4().hex}") for name in NAMES)
    dora = api.token("Dora", uuid.uuid4().hex)
    table_id, other = await table_for(api, ana, bia), await table_for(api, caio, dora)
    await published(db, table_id)
    await published(db, other)
    rng = random.Random(5)
    tokens = [ana, bia]
    if await to_act(api, table_id) == 0:  # Ana to act: she moves until it is Bia's turn
        while await to_act(api, table_id) == 0:
            await move(api, table_id, ana, rng)
    async with api.client.ws_connect(f"/v1/players/me/ws?token={ana}") as ws:
        first = await ws_receive(ws)
        assert first["kind"] == "tables"
        entry = next(e for e in first["tables"] if e["table_id"] == table_id)
        assert entry["my_turn"] is False
        # Someone else's table: nothing.
        others = [caio, dora]
        await move(api, other, others[await to_act(api, other)], rng)
        await published(db, other)
        await ws_silent(ws, 1.0)
        # Bia moves until it is Ana's turn: a frame with my_turn true.
        while await to_act(api, table_id) == 1:
            await move(api, table_id, tokens[1], rng)
        messages = await ws_until(
            ws, lambda ms: any(m["kind"] == "table" and m["table"]["my_turn"] for m in ms)
        )
        frame = messages[-1]["table"]
        assert frame["table_id"] == table_id
        assert frame["to_act"] == 0
        assert frame["you"] == 0
        # A new table of mine is told too.
        created = await api.create(ana)
        messages = await ws_until(
            ws,
            lambda ms: any(
                m["kind"] == "table" and m["table"]["table_id"] == created["table_id"] for m in ms
            ),
        )
        assert messages[-1]["table"]["status"] == "waiting"


async def test_the_player_socket_needs_a_token(api: Api) -> None:
    status, body = await api.call("GET", "/v1/players/me/ws")
    assert status == 401, body


async def test_the_player_socket_is_admitted_and_closed_as_a_table_socket_is(
    settings: Settings,
) -> None:
    """GIN_MAX_SOCKETS counts player sockets with table sockets: past it, 1013 at once; a
    player socket closes with 4001 when its token expires; it takes no messages."""
    limited = msgspec.structs.replace(settings, max_sockets=1, auth_leeway_s=0.0)
    async with open_api(limited) as api:
        ana = api.token("Ana", uuid.uuid4().hex)
        brief = mint(settings.auth_secret, uuid.uuid4().hex, "Breve", ttl_s=2)
        async with api.client.ws_connect(f"/v1/players/me/ws?token={brief}") as first:
            assert (await ws_receive(first))["kind"] == "tables"
            await first.send_str("{}")
            error = await ws_receive(first)
            assert error["kind"] == "error"
            assert error["error"]["code"] == "invalid_request"
            async with api.client.ws_connect(f"/v1/players/me/ws?token={ana}") as second:
                msg = await asyncio.wait_for(second.receive(), 10)
                assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, CLOSE_TRY_AGAIN_LATER)
                assert msg.extra == TRY_AGAIN_REASON
            msg = await asyncio.wait_for(first.receive(), 15)
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, CLOSE_TOKEN_EXPIRED)
        for _ in range(100):  # the server takes the closed socket off its count
            async with api.client.ws_connect(f"/v1/players/me/ws?token={ana}") as again:
                frame = await asyncio.wait_for(again.receive(), 10)
                if frame.type == aiohttp.WSMsgType.TEXT:
                    break
            await asyncio.sleep(0.05)
        assert frame.type == aiohttp.WSMsgType.TEXT, frame


async def test_the_list_counts_against_its_own_limit(settings: Settings) -> None:
    """The limited reads name limits the rate limiter has; past ``GIN_RATE_LISTS`` the list
    is 429 ``rate_limited`` with Retry-After, and another caller is not held back."""
    known = set(RateLimiter.from_settings(None, Settings()).limits)  # type: ignore[arg-type]
    assert set(READ_LIMITS.values()) <= known
    assert READ_LIMITS[("GET", "/v1/players/me/tables")] == "lists"
    limited = msgspec.structs.replace(settings, rate_lists=2)
    async with open_api(limited) as api:
        ana, bia = (api.token(n, uuid.uuid4().hex) for n in ("Ana", "Bia"))
        for _ in range(2):
            assert (await my_tables(api, ana))[0] == 200
        async with api.client.get("/v1/players/me/tables", headers=api.auth(ana)) as r:
            assert r.status == 429
            assert int(r.headers["Retry-After"]) >= 1
            assert (await r.json())["error"]["code"] == "rate_limited"
        assert (await my_tables(api, bia))[0] == 200


async def test_a_closed_player_socket_leaves_its_tables_unwatched(api: Api) -> None:
    """The lobby forgets a player whose last socket closed, by their own tables (a release
    costs those, not every table watched on the replica); the other player's stay watched."""
    ana_id, bia_id = f"Ana-{uuid.uuid4().hex}", f"Bia-{uuid.uuid4().hex}"
    ana, bia = api.token("Ana", ana_id), api.token("Bia", bia_id)
    table_id = await table_for(api, ana, bia)
    lobby = api.client.server.app[LOBBY_KEY]
    async with api.client.ws_connect(f"/v1/players/me/ws?token={bia}") as bias:
        assert (await ws_receive(bias))["kind"] == "tables"
        async with api.client.ws_connect(f"/v1/players/me/ws?token={ana}") as anas:
            assert (await ws_receive(anas))["kind"] == "tables"
            assert lobby.watching[table_id] == {ana_id, bia_id}
            assert table_id in lobby.tables_of[ana_id]
        deadline = asyncio.get_running_loop().time() + 10
        while ana_id in lobby.players and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)  # the server's side of the close runs after the client's
        assert ana_id not in lobby.players
        assert ana_id not in lobby.tables_of
        assert lobby.watching[table_id] == {bia_id}
        assert all(ana_id not in who for who in lobby.watching.values())


async def test_the_player_socket_is_sent_its_list_again_after_the_feed_reopens(
    api: Api, db: asyncpg.Connection
) -> None:
    """The events relayed while the hub's broker channel was away never reach this replica's
    lobby: once the channel is back, each player socket is sent its first page again (a
    ``tables`` frame, the client's whole list, as after a reconnect), current as of then."""
    ana, bia = (api.token(name, f"{name}-{uuid.uuid4().hex}") for name in NAMES[:2])
    table_id = await table_for(api, ana, bia)
    await published(db, table_id)
    rng = random.Random(8)
    while await to_act(api, table_id) == 0:  # Bia's turn when Ana's socket opens
        await move(api, table_id, ana, rng)
    hub = api.client.server.app[HUB]
    async with api.client.ws_connect(f"/v1/players/me/ws?token={ana}") as ws:
        first = await ws_receive(ws)
        assert first["kind"] == "tables"
        assert not next(e for e in first["tables"] if e["table_id"] == table_id)["my_turn"]
        assert hub.channel is not None
        await hub.channel.close()
        while await to_act(api, table_id) == 1:  # Bia moves: relayed while the queue is gone
            await move(api, table_id, bia, rng)
        await published(db, table_id)
        await hub.channel.reopen()  # as aio-pika does after a reconnect
        messages = await ws_until(ws, lambda ms: any(m["kind"] == "tables" for m in ms))
        again = next(m for m in messages if m["kind"] == "tables")
        entry = next(e for e in again["tables"] if e["table_id"] == table_id)
        assert entry["my_turn"] is True
        assert entry["to_act"] == 0


async def test_every_player_socket_gets_its_list_again_batch_after_batch(api: Api) -> None:
    """More player sockets than a batch of pages sent again: each gets its list once."""
    hub = api.client.server.app[HUB]
    sockets = []
    try:
        for n in range(RELIST_BATCH + 5):
            token = api.token(f"P{n}", f"relist-{n}-{uuid.uuid4().hex}")
            ws = await api.client.ws_connect(f"/v1/players/me/ws?token={token}")
            sockets.append(ws)
            assert (await ws_receive(ws))["kind"] == "tables"
        assert hub.channel is not None
        await hub.channel.close()
        await hub.channel.reopen()
        for ws in sockets:
            assert (await ws_receive(ws))["kind"] == "tables"
        for ws in (sockets[0], sockets[-1]):  # once: of the first batch and of the last
            await ws_silent(ws, 0.5)
    finally:
        for ws in sockets:
            await ws.close()
