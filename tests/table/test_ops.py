"""Operations and the table's life: health, readiness, metrics, development tokens, rematch,
decline, the deck design preference, and a creator leaving a waiting table."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.table.app import RELAY, create_app
from shared.infra import service
from shared.infra.auth import Verifier
from shared.infra.service import POOL
from shared.infra.settings import Settings
from tests.table.conftest import (
    Api,
    Clock,
    SeededShuffle,
    all_events,
    assert_error,
    open_api,
    play_to_the_end,
    serving,
    ws_receive,
    ws_until,
)


async def metrics(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with api.client.get("/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def commands_total(values: dict[Any, float], kind: str, outcome: str) -> float:
    key = ("gin_commands_total", (("outcome", outcome), ("type", kind)))
    return values.get(key, 0.0)


async def test_healthz_and_readyz(api: Api) -> None:
    assert await api.call("GET", "/healthz") == (200, {"status": "ok"})
    status, body = await api.call("GET", "/readyz")
    assert status == 200
    assert body == {"status": "ready", "checks": {"postgresql": "ok", "rabbitmq": "ok"}}


async def test_metrics_count_commands_and_show_the_outbox_lag(api: Api) -> None:
    table_id, ana, bia = await api.table_for_two()
    seat = (await api.view(table_id))["hand"]["to_act"]
    tokens = [ana, bia]
    before = await metrics(api)
    status, _ = await api.command(table_id, tokens[seat], type="pass_upcard")
    assert status == 200
    status, _ = await api.command(table_id, tokens[seat], type="pass_upcard")  # not its turn
    assert status == 409
    status, _ = await api.command(table_id, tokens[1 - seat], type="draw", source="stock")
    assert status == 409  # the upcard is still offered
    after = await metrics(api)
    assert commands_total(after, "PassUpcard", "applied") == (
        commands_total(before, "PassUpcard", "applied") + 1
    )
    assert commands_total(after, "PassUpcard", "refused") == (
        commands_total(before, "PassUpcard", "refused") + 1
    )
    assert commands_total(after, "Draw", "refused") == commands_total(before, "Draw", "refused") + 1
    assert commands_total(after, "Draw", "applied") == commands_total(before, "Draw", "applied")
    lag = [v for (name, _), v in after.items() if name == "gin_outbox_lag_seconds"]
    assert len(lag) == 1
    assert lag[0] >= 0
    latency = [
        v
        for (name, labels), v in after.items()
        if name == "gin_command_seconds_count" and labels == (("type", "PassUpcard"),)
    ]
    assert latency == [2.0]


async def test_a_commit_as_the_app_stops_does_not_hold_its_shutdown(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that wakes the relay in the very turn the cleanup cancels it (the last move
    before a shutdown) holds nothing up: the relay stops and the pool closes. (The relay
    waited with Python 3.11's wait_for, which returned the wake-up and dropped the
    cancellation: the cleanup waited for good.)"""
    app = create_app(settings, clock=Clock(), shuffle=SeededShuffle(7))
    cancel = service.cancel

    async def cancel_as_a_commit_wakes_the_relay(*tasks: asyncio.Task[None]) -> None:
        if any(task.get_name() == "outbox-relay" for task in tasks):
            app[RELAY].committed()
        await cancel(*tasks)

    monkeypatch.setattr(service, "cancel", cancel_as_a_commit_wakes_the_relay)
    async with serving(app) as client:  # fails if the shutdown takes over SHUTDOWN_BOUND_S
        api = Api(client, settings)
        ana = api.token("Ana")
        table_id = (await api.create(ana))["table_id"]
        status, body = await api.call("POST", f"/v1/tables/{table_id}/bot", ana, {"level": "tito"})
        assert status == 200, body
        await asyncio.sleep(0.3)  # the relay has published it and waits to be woken again
    assert app[POOL].is_closing()


async def test_dev_tokens_are_minted_when_enabled(api: Api, settings: Settings) -> None:
    assert settings.dev_tokens
    status, body = await api.call("POST", "/v1/dev/tokens", body={"name": "Zé"})
    assert status == 201, body
    assert body["name"] == "Zé"
    assert body["sub"].startswith("dev-")
    identity = Verifier.from_settings(settings).verify(body["token"])
    assert (identity.id, identity.name) == (body["sub"], "Zé")
    status, again = await api.call("POST", "/v1/dev/tokens", body={"name": "Zé", "sub": "ze-7"})
    assert status == 201
    assert again["sub"] == "ze-7"
    created = await api.create(again["token"])
    assert created["view"]["seats"][0] == {"name": "Zé", "id": "ze-7"}
    for bad in ({}, {"name": ""}, {"name": "Zé", "admin": True}):
        status, error = await api.call("POST", "/v1/dev/tokens", body=bad)
        assert_error(status, error, 400, "invalid_request", None)


async def test_dev_tokens_do_not_exist_when_disabled(settings: Settings) -> None:
    production = msgspec.structs.replace(settings, dev_tokens=False)
    async with open_api(production) as api:
        async with api.client.post("/v1/dev/tokens", json={"name": "Zé"}) as r:
            assert r.status == 404
        assert (await api.call("GET", "/healthz"))[0] == 200


async def test_creating_a_table_answers_the_invitation(api: Api, settings: Settings) -> None:
    ana = api.token("Ana")
    status, created = await api.call("POST", "/v1/tables", ana)  # no body: default options
    assert status == 201, created
    assert set(created) == {"table_id", "invite_code", "invite_url", "seat", "view"}
    assert created["seat"] == 0
    assert created["invite_url"] == (
        f"{settings.public_url}/tables/{created['table_id']}?invite={created['invite_code']}"
    )
    assert len(created["invite_code"]) >= 16
    assert created["invite_code"] not in created["table_id"]
    view = created["view"]
    assert (view["status"], view["you"], view["version"]) == ("waiting", 0, 1)
    assert view["seats"][1] is None
    assert view["options"]["target"] == 100
    assert await api.view(created["table_id"], ana) == view
    public = await api.view(created["table_id"])
    assert created["invite_code"] not in msgspec.json.encode(public).decode()
    log = await all_events(api, created["table_id"])
    assert [e["type"] for e in log] == ["table_created", "seat_taken"]
    assert created["invite_code"] not in msgspec.json.encode(log).decode()


# --- rematch, decline, leave (R9.4, R10.1) ----------------------------------------------------


async def finished_match(api: Api, seed: int) -> tuple[str, list[str], dict[str, Any]]:
    """A table whose match (to 1 point) was played to the end: the first scored hand ends it."""
    table_id, ana, bia = await api.table_for_two({"target": 1})
    final = await play_to_the_end(api, table_id, [ana, bia], seed)
    assert final["status"] == "match_over"
    assert final["match"]["result"]["reason"] == "target"
    assert sum(final["match"]["scores"]) > 0
    return table_id, [ana, bia], final


async def test_r9_4_both_agree_a_rematch_starts_from_zero(api: Api) -> None:
    table_id, tokens, final = await finished_match(api, seed=1)
    assert {"type": "rematch"} in final["legal"]
    status, body = await api.command(table_id, tokens[0], type="rematch")
    assert status == 200, body
    assert [e["type"] for e in body["events"]] == ["rematch_offered"]
    assert body["view"]["status"] == "match_over"
    assert body["view"]["match"]["rematch_offers"] == [0]
    assert {"type": "rematch"} not in body["view"]["legal"]
    status, error = await api.command(table_id, tokens[0], type="rematch")
    assert_error(status, error, 409, "rematch_already_offered", "R9.4")

    status, body = await api.command(table_id, tokens[1], type="rematch")
    assert status == 200, body
    types = [e["type"] for e in body["events"]]
    assert types == ["rematch_offered", "rematch_accepted", "match_started", "hand_started"]
    started = body["events"][3]["data"]
    assert started["reason"] == "lot"
    assert body["events"][2]["data"]["options"] == final["options"]
    view = body["view"]
    assert view["status"] == "playing"
    assert view["match"]["number"] == final["match"]["number"] + 1
    assert view["match"]["scores"] == [0, 0]
    assert view["match"]["hands_won"] == [0, 0]
    assert view["match"]["rematch_offers"] == []
    assert "result" not in view["match"]
    assert view["seats"] == final["seats"]
    assert view["options"] == final["options"]
    assert len(view["hand"]["my_cards"]) == 10
    assert started["hand"] > final["match"]["last_hand"]["hand"]  # hand numbers run on
    public = await api.view(table_id)
    assert public["match"]["scores"] == [0, 0]


async def test_r9_4_with_a_bot_the_humans_rematch_alone_starts_it(api: Api) -> None:
    ana = api.token("Ana")
    table_id = (await api.create(ana, {"target": 50}))["table_id"]
    status, body = await api.call("POST", f"/v1/tables/{table_id}/bot", ana, {"level": "tito"})
    assert status == 200, body
    status, body = await api.command(table_id, ana, type="resign")
    assert status == 200, body
    result = body["view"]["match"]["result"]
    assert (result["reason"], result["winner"], result["by"]) == ("resigned", 1, 0)
    status, body = await api.command(table_id, ana, type="rematch")
    assert status == 200, body
    types = [e["type"] for e in body["events"]]
    assert types == [
        "rematch_offered",
        "rematch_offered",
        "rematch_accepted",
        "match_started",
        "hand_started",
    ]
    assert [e["data"]["seat"] for e in body["events"][:2]] == [0, 1]
    view = body["view"]
    assert view["status"] == "playing"
    assert view["match"]["number"] == 2
    assert view["match"]["scores"] == [0, 0]
    assert view["seats"][1] == {"name": "TITO", "bot": "tito"}


async def test_r9_4_a_declined_rematch_closes_the_table(api: Api) -> None:
    table_id, tokens, _ = await finished_match(api, seed=2)
    status, body = await api.command(table_id, tokens[0], type="rematch")
    assert status == 200, body
    status, body = await api.command(table_id, tokens[1], type="decline_rematch")
    assert status == 200, body
    assert [e["type"] for e in body["events"]] == ["table_closed"]
    assert body["events"][0]["data"]["reason"] == "rematch_declined"
    assert body["view"]["status"] == "closed"
    assert body["view"]["legal"] == []
    log = await all_events(api, table_id)
    version = (await api.view(table_id))["version"]
    for token in tokens:
        for command in ({"type": "rematch"}, {"type": "leave"}, {"type": "decline_rematch"}):
            status, error = await api.command(table_id, token, **command)
            assert_error(status, error, 409, "table_closed", "R10.3")
    assert await all_events(api, table_id) == log
    public = await api.view(table_id)
    assert public["version"] == version
    assert public["status"] == "closed"
    assert public["match"]["result"]["reason"] == "target"  # the result stays


async def test_r9_4_leaving_after_a_match_closes_the_table(api: Api) -> None:
    table_id, tokens, _ = await finished_match(api, seed=3)
    status, body = await api.command(table_id, tokens[1], type="leave")
    assert status == 200, body
    assert [(e["type"], e["data"].get("reason")) for e in body["events"]] == [
        ("table_closed", "left")
    ]
    status, error = await api.command(table_id, tokens[0], type="rematch")
    assert_error(status, error, 409, "table_closed", "R10.3")


async def test_r10_1_a_creator_leaving_a_waiting_table_closes_it(api: Api) -> None:
    ana = api.token("Ana")
    created = await api.create(ana)
    table_id = created["table_id"]
    assert created["view"]["legal"] == [{"type": "leave"}]
    status, body = await api.command(table_id, ana, type="leave")
    assert status == 200, body
    assert [e["type"] for e in body["events"]] == ["table_closed"]
    assert body["events"][0]["data"]["reason"] == "creator_left"
    assert body["view"]["status"] == "closed"
    assert body["view"]["legal"] == []
    log = await all_events(api, table_id)
    assert [e["type"] for e in log] == ["table_created", "seat_taken", "table_closed"]
    # Nobody sits at a closed table, and it takes no command.
    code = {"invite_code": created["invite_code"]}
    status, error = await api.call("POST", f"/v1/tables/{table_id}/join", api.token("Bia"), code)
    assert status == 409, error
    status, error = await api.call("POST", f"/v1/tables/{table_id}/bot", ana, {"level": "tito"})
    assert status == 409, error
    status, error = await api.command(table_id, ana, type="leave")
    assert_error(status, error, 409, "table_closed", "R10.3")
    assert await all_events(api, table_id) == log
    assert (await api.view(table_id))["status"] == "closed"


async def test_joining_a_closed_table_is_refused_as_closed(api: Api) -> None:
    ana = api.token("Ana")
    created = await api.create(ana)
    table_id = created["table_id"]
    status, _ = await api.command(table_id, ana, type="leave")
    assert status == 200
    code = {"invite_code": created["invite_code"]}
    status, error = await api.call("POST", f"/v1/tables/{table_id}/join", api.token("Bia"), code)
    assert status == 409
    assert error["error"]["code"] == "table_closed"


# --- the deck design (R10.7) ------------------------------------------------------------------


async def test_r10_7_the_deck_design_round_trips_and_comes_with_the_players_views(
    api: Api,
) -> None:
    table_id, ana, bia = await api.table_for_two()
    status, body = await api.call("GET", "/v1/players/me/preferences", ana)
    assert (status, body) == (200, {"deck_design": None})
    status, body = await api.call(
        "PUT", "/v1/players/me/preferences", ana, {"deck_design": "selminha-azul"}
    )
    assert (status, body) == (200, {"deck_design": "selminha-azul"})
    status, body = await api.call("GET", "/v1/players/me/preferences", ana)
    assert (status, body) == (200, {"deck_design": "selminha-azul"})
    # Her views carry it; Bia's and the public view do not.
    assert (await api.view(table_id, ana))["deck_design"] == "selminha-azul"
    assert (await api.view(table_id, bia))["deck_design"] is None
    assert (await api.view(table_id))["deck_design"] is None
    created = await api.create(ana)
    assert created["view"]["deck_design"] == "selminha-azul"
    async with api.client.ws_connect(f"/v1/tables/{table_id}/ws?token={ana}") as ws:
        snapshot = await ws_receive(ws)
        assert snapshot["view"]["deck_design"] == "selminha-azul"
        seat = snapshot["view"]["hand"]["to_act"]
        status, result = await api.command(table_id, [ana, bia][seat], type="pass_upcard")
        assert status == 200, result
        assert result["view"]["deck_design"] == ("selminha-azul" if seat == 0 else None)
        seq = result["events"][-1]["seq"]
        messages = await ws_until(
            ws, lambda ms: any(m["kind"] == "event" and m["event"]["seq"] == seq for m in ms)
        )
        assert all(m["view"]["deck_design"] == "selminha-azul" for m in messages)
    # It changes no rule: the cards and the legal moves are the same as before.
    before = await api.view(table_id, ana)
    status, body = await api.call("PUT", "/v1/players/me/preferences", ana, {"deck_design": "x2"})
    assert status == 200
    after = await api.view(table_id, ana)
    assert after["deck_design"] == "x2"
    assert {**after, "deck_design": None} == {**before, "deck_design": None}
    # Bia's own preference is hers alone.
    await api.call("PUT", "/v1/players/me/preferences", bia, {"deck_design": "classic"})
    assert (await api.view(table_id, bia))["deck_design"] == "classic"
    assert (await api.view(table_id, ana))["deck_design"] == "x2"


async def test_r10_7_a_bad_deck_design_is_refused(api: Api) -> None:
    ana = api.token("Ana")
    await api.call("PUT", "/v1/players/me/preferences", ana, {"deck_design": "classic"})
    for body in (
        {"deck_design": ""},
        {"deck_design": "Selminha Azul"},
        {"deck_design": "x" * 41},
        {"deck_design": "../etc"},
        {"deck_design": 7},
        {},
        {"deck_design": "ok", "colour": "red"},
    ):
        status, error = await api.call("PUT", "/v1/players/me/preferences", ana, body)
        assert_error(status, error, 400, "invalid_request", None)
    assert await api.call("GET", "/v1/players/me/preferences", ana) == (
        200,
        {"deck_design": "classic"},
    )
