"""Erasure on request (issue 32 part 4, LGPD art. 18): ``DELETE /v1/players/me`` and the
operator's ``python -m services.table.erasure <subject>`` leave neither the person's subject
nor their name anywhere in the table service's schema, keep the games whole, tell subscribers
with ``player_erased``, and change nothing the second time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from typing import Any

import asyncpg
import msgspec
from aiohttp.test_utils import TestClient

from services.table.erasure import ERASED_NAME, scrubbed
from services.table.http import LIMITS, TABLES
from shared.contracts.events import Player
from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra.settings import Settings
from tests.e2e.processes import ROOT
from tests.table.conftest import (
    Api,
    Tap,
    all_events,
    open_api,
    play_to_the_end,
    published,
    ws_receive,
    ws_until,
)

# The rate limits' counts are shared by hand here (the interval is an hour), so the counts of
# the erasure's own request do not come back into the schema while the test looks; published
# outbox rows, which the erasure leaves to the outbox's retention, are kept a second.
QUIET = {"rate_sync_s": 3600.0, "outbox_retention_s": 1.0}


def who(name: str) -> tuple[str, str]:
    """A subject and a display name no other test uses: a scan of the whole schema finds
    only this test's person."""
    tag = uuid.uuid4().hex[:10]
    return f"sub-{name.lower()}-{tag}", f"{name} Erasmo {tag}"


async def places_holding(db: asyncpg.Connection, schema: str, *needles: str) -> list[str]:
    """Every ``table.column`` of the schema (text, jsonb or bytea, of every table, partition
    and view) in which a row holds one of ``needles``: empty once a person is erased."""
    columns = await db.fetch(
        "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c"
        " WHERE c.table_schema = $1"
        " AND c.data_type IN ('text', 'jsonb', 'bytea', 'character varying', 'json')",
        schema,
    )
    found = []
    for table, column, kind in columns:
        where = (
            f"position(convert_to($1, 'UTF8') IN \"{column}\") > 0"
            if kind == "bytea"
            else f'strpos("{column}"::text, $1) > 0'
        )
        for needle in needles:
            hits = await db.fetchval(
                f'SELECT count(*) FROM "{schema}"."{table}" WHERE {where}', needle
            )
            if hits:
                found.append(f"{table}.{column} ({hits} holding {needle!r})")
    return found


async def gone_from(
    db: asyncpg.Connection, schema: str, *needles: str, within_s: float = 15.0
) -> None:
    """Wait until no column of the schema holds ``needles``: at once but for the outbox's
    published rows, which the outbox's retention deletes."""
    deadline = asyncio.get_running_loop().time() + within_s
    while found := await places_holding(db, schema, *needles):
        assert all(place.startswith("outbox.body ") for place in found), found
        assert asyncio.get_running_loop().time() < deadline, found
        await asyncio.sleep(0.2)


async def erase(api: Api, token: str | None) -> int:
    """``DELETE /v1/players/me``: its status (a 204 has no body)."""
    status, body = await api.call("DELETE", "/v1/players/me", token)
    assert status != 204 or body is None, body
    return status


def plain_move(view: dict[str, Any]) -> dict[str, Any]:
    """A legal move that is not a way out of the match."""
    quits = ("resign", "leave", "claim_absence")
    return next(m for m in view["legal"] if m["type"] not in quits)


def app_of(api: Api) -> Any:
    client: TestClient = api.client
    return client.app


async def test_unit_scrubbed_replaces_every_copy_of_the_person_and_nothing_else() -> None:
    pseudo = Player(id="erased-x", name=ERASED_NAME)
    doc = {
        "id": "6f1c",
        "data": {"player": {"name": "Ana", "id": "s1"}, "creator": {"name": "B", "id": "s2"}},
        "view": {"seats": [{"name": "Ana", "id": "s1"}, {"name": "TITO", "bot": "tito"}]},
        "text": "s1",
    }
    out, changed = scrubbed(doc, "s1", pseudo)
    assert changed
    assert out["data"]["player"] == {"name": ERASED_NAME, "id": "erased-x"}
    assert out["data"]["creator"] == {"name": "B", "id": "s2"}
    assert out["view"]["seats"] == [
        {"name": ERASED_NAME, "id": "erased-x"},
        doc["view"]["seats"][1],
    ]
    assert out["text"] == "s1"  # a plain string is not a Player
    assert scrubbed(doc, "nobody", pseudo) == (doc, False)


async def test_erasure_leaves_no_trace_of_the_person_and_the_games_whole(
    settings: Settings,
) -> None:
    s = msgspec.structs.replace(settings, **QUIET)
    ana_sub, ana_name = who("Ana")
    bia_sub, bia_name = who("Bia")
    async with (
        open_api(s) as api,
        Tap(s, EVENTS_EXCHANGE, "table.*.player_erased") as tap,
    ):
        db = await asyncpg.connect(s.database_url, server_settings={"search_path": "gin_table"})
        try:
            ana, bia = api.token(ana_name, ana_sub), api.token(bia_name, bia_sub)
            # 1. A whole match against Bia, the first move of each with a command id.
            created = await api.create(ana)
            played = created["table_id"]
            status, body = await api.call(
                "POST", f"/v1/tables/{played}/join", bia, {"invite_code": created["invite_code"]}
            )
            assert status == 200, body
            tokens = [ana, bia]
            movers: set[int] = set()
            for n in range(8):  # moves with command ids until each has sent one
                if movers == {0, 1}:
                    break
                seat = (await api.view(played))["hand"]["to_act"]
                move = plain_move(await api.view(played, tokens[seat]))
                status, body = await api.command(played, tokens[seat], **move, command_id=f"c{n}")
                assert status == 200, body
                movers.add(seat)
            end = await play_to_the_end(api, played, tokens, seed=3)
            assert end["status"] == "match_over"
            # 2. A match on against TITO; 3. a table nobody joined.
            on = (await api.create(ana))["table_id"]
            status, body = await api.call("POST", f"/v1/tables/{on}/bot", ana, {"level": "tito"})
            assert status == 200, body
            waiting = (await api.create(ana))["table_id"]
            # 4. Bia's own table, which Ana never sat at.
            theirs = (await api.create(bia))["table_id"]
            status, body = await api.call(
                "PUT", "/v1/players/me/preferences", ana, {"deck_design": "azul"}
            )
            assert status == 200, body
            await app_of(api)[LIMITS].sync()  # Ana's counts are in rate_limits now
            assert await db.fetchval(
                "SELECT count(*) FROM rate_limits WHERE identity = $1", ana_sub
            )
            assert await places_holding(db, "gin_table", ana_sub, ana_name)
            before = {t: await all_events(api, t) for t in (played, on, waiting, theirs)}
            answers = await db.fetch(
                "SELECT actor, command_id FROM commands WHERE table_id = $1 ORDER BY 1, 2", played
            )
            assert {a for a, _ in answers} == {f"person:{ana_sub}", f"person:{bia_sub}"}
            hands = await db.fetchval("SELECT count(*) FROM hands WHERE table_id = $1", played)
            assert hands >= 1

            assert await erase(api, None) == 401
            assert await erase(api, ana) == 204
            for table_id in (played, on, waiting):
                await published(db, table_id)

            # Nowhere in the schema: not the subject, not the name.
            await gone_from(db, "gin_table", ana_sub, ana_name)
            # Every event is where it was, with the leaves and one player_erased after them.
            after = {t: await all_events(api, t) for t in before}
            assert after[theirs] == before[theirs]
            pseudonyms = set()
            for table_id in (played, on, waiting):
                old, new = before[table_id], after[table_id]
                assert [e["seq"] for e in new] == list(range(1, len(new) + 1))
                assert [e["id"] for e in new[: len(old)]] == [e["id"] for e in old]
                last = new[-1]
                assert last["type"] == "player_erased"
                assert last["data"]["seat"] == 0
                assert last["data"]["player"]["name"] == ERASED_NAME
                pseudonyms.add(last["data"]["player"]["id"])
                view = await api.view(table_id)
                assert view["seats"][0] == last["data"]["player"]
                assert view["status"] == "closed"
                assert view["version"] == last["version"]
            assert len(pseudonyms) == 1  # one pseudonym per erasure
            assert next(iter(pseudonyms)).startswith("erased-")
            # The match on ended as if Ana had left: TITO wins; the finished match is kept.
            ended = [e["data"] for e in after[on] if e["type"] == "match_ended"]
            assert [(d["reason"], d["winner"], d["by"]) for d in ended] == [("left", 1, 0)]
            closed = [e["data"]["reason"] for e in after[waiting] if e["type"] == "table_closed"]
            assert closed == ["creator_left"]
            created_event = after[played][0]["data"]
            assert created_event["creator"]["name"] == ERASED_NAME
            bia_view = await api.view(played, bia)
            assert bia_view["you"] == 1
            assert bia_view["seats"][1] == {"name": bia_name, "id": bia_sub}
            assert bia_view["seats"][0]["name"] == ERASED_NAME
            assert await db.fetchval("SELECT count(*) FROM hands WHERE table_id = $1", played) == (
                hands
            )
            status, record = await api.call("GET", f"/v1/tables/{played}/hands/1")
            assert status == 200, record
            # Ana's command ids are gone; Bia's answers are kept (with the pseudonym: scanned).
            kept = await db.fetch(
                "SELECT actor, command_id FROM commands WHERE table_id = $1 ORDER BY 1, 2", played
            )
            assert kept == [r for r in answers if r[0] != f"person:{ana_sub}"]

            # Subscribers were told, at each table, with no trace of the person.
            bodies = await tap.collect(lambda b: len(b) >= 3)
            assert sorted(b["table_id"] for b in bodies) == sorted((played, on, waiting))
            for b in bodies:
                raw = msgspec.json.encode(b).decode()
                assert ana_sub not in raw
                assert ana_name not in raw
                assert b["data"]["player"]["id"] in pseudonyms

            # Again: 204, nothing changes, nothing is published.
            assert await erase(api, ana) == 204
            assert {t: await all_events(api, t) for t in before} == after
            assert await tap.drain(quiet=1.0) == []
            # The counts of the current windows (here the erasures' own) come back with the
            # next sync, each until its window ends: the limits need them (deploy/README.md).
            await app_of(api)[LIMITS].sync()
            back = await db.fetch("SELECT action FROM rate_limits WHERE identity = $1", ana_sub)
            assert [r[0] for r in back] == ["preferences"]
            # The token still works: a person with no seat and no preferences.
            status, body = await api.call("GET", "/v1/players/me/preferences", ana)
            assert (status, body) == (200, {"deck_design": None})
            assert (await api.view(played, ana))["you"] is None
        finally:
            await db.close()


async def test_the_operator_erases_by_subject(settings: Settings) -> None:
    """``python -m services.table.erasure <subject>``: the same erasure, from a shell in the
    service's pod; the running relay is woken and publishes ``player_erased``."""
    ana_sub, ana_name = who("Ana")
    settings = msgspec.structs.replace(settings, **QUIET)
    async with (
        open_api(settings) as api,
        Tap(settings, EVENTS_EXCHANGE, "table.*.player_erased") as tap,
    ):
        ana = api.token(ana_name, ana_sub)
        table_id, _, _ = await api.table_for_two()
        created = await api.create(ana)
        status, body = await api.call(
            "POST", f"/v1/tables/{created['table_id']}/bot", ana, {"level": "carmen"}
        )
        assert status == 200, body
        env = {**os.environ, "GIN_DATABASE_URL": settings.database_url}
        run = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.table.erasure", ana_sub],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        assert "1 table" in run.stdout
        assert ana_sub not in run.stdout
        bodies = await tap.collect(lambda b: len(b) >= 1)
        assert [b["table_id"] for b in bodies] == [created["table_id"]]
        view = await api.view(created["table_id"])
        assert view["seats"][0]["name"] == ERASED_NAME
        assert view["status"] == "closed"
        db = await asyncpg.connect(
            settings.database_url, server_settings={"search_path": "gin_table"}
        )
        try:
            await gone_from(db, "gin_table", ana_sub, ana_name)
        finally:
            await db.close()
        assert (await api.view(table_id))["seats"][0]["name"] == "Ana"  # others' tables
        usage = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.table.erasure"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert usage.returncode == 2


async def test_a_replica_that_remembers_the_table_shows_the_pseudonym(
    settings: Settings,
) -> None:
    """Replica B remembers the table (its committed row, a spectator socket's snapshot);
    the erasure at replica A reaches B's sockets as ``player_erased`` with views of the
    pseudonym, and a new socket at B is served the pseudonym, never the name."""
    ana_sub, ana_name = who("Ana")
    bia_sub, bia_name = who("Bia")
    async with open_api(settings) as one, open_api(settings) as two:
        ana, bia = one.token(ana_name, ana_sub), one.token(bia_name, bia_sub)
        created = await one.create(ana)
        table_id = created["table_id"]
        status, body = await one.call(
            "POST", f"/v1/tables/{table_id}/join", bia, {"invite_code": created["invite_code"]}
        )
        assert status == 200, body
        seat = (await two.view(table_id))["hand"]["to_act"]
        mover = [ana, bia][seat]
        move = plain_move(await two.view(table_id, mover))
        status, body = await two.command(table_id, mover, **move)  # B remembers the row
        assert status == 200, body
        path = f"/v1/tables/{table_id}/ws"
        async with (
            two.client.ws_connect(path) as watcher,
            two.client.ws_connect(f"{path}?token={bia}") as bia_ws,
        ):
            for ws in (watcher, bia_ws):
                snapshot = await ws_receive(ws)
                assert snapshot["kind"] == "snapshot"
                assert snapshot["view"]["seats"][0]["name"] == ana_name
            assert await erase(one, ana) == 204
            for ws in (watcher, bia_ws):
                frames = await ws_until(
                    ws, lambda m: bool(m) and m[-1]["event"]["type"] == "player_erased"
                )
                for frame in frames:
                    raw = msgspec.json.encode(frame).decode()
                    assert ana_name not in raw, frame
                    assert ana_sub not in raw, frame
                assert frames[-1]["view"]["seats"][0]["name"] == ERASED_NAME
            for token in (None, bia, ana):
                url = path if token is None else f"{path}?token={token}"
                async with two.client.ws_connect(url) as ws:
                    snapshot = await ws_receive(ws)
                    raw = msgspec.json.encode(snapshot).decode()
                    assert ana_name not in raw
                    assert ana_sub not in raw
                    assert snapshot["view"]["seats"][0]["name"] == ERASED_NAME
                    assert snapshot["view"]["you"] == (1 if token == bia else None)
        assert (await two.view(table_id, ana))["seats"][0]["name"] == ERASED_NAME
        # nor does B keep the person in memory: its stale row and seating were dropped
        memory = two.client.app[TABLES].memory
        for kept in (memory.row(table_id), memory.seating(table_id)):
            assert ana_sub not in repr(kept)
            assert ana_name not in repr(kept)
