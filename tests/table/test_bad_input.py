"""Refused requests: the right 4xx, the one error shape, and nothing changed (docs/DESIGN.md 2).

Every hand here is dealt from one crafted deck (lot 0: Ana, seat 0, deals; Bia, seat 1, is the
non-dealer and decides first). Bia holds 4d 4h 4s, 7h 8h 9h Th, As 5s Kd; the upcard is 5c.
After taking it, her best knock discards Kd and leaves exactly 11 points of deadwood (As 5s
5c): one over the limit, so every knock is refused (R6.6).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import asyncpg
import msgspec
import pytest
from aiohttp.test_utils import TestClient

from services.table.app import create_app
from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.serving import ProductionServer
from tests.table.conftest import (
    Api,
    Clock,
    ScriptedShuffle,
    all_events,
    assert_error,
    crafted_deck,
)

BIA = ["4d", "4h", "4s", "7h", "8h", "9h", "Th", "As", "5s", "Kd"]
ANA = ["2c", "3c", "6c", "8c", "Jc", "2d", "6d", "9d", "Qd", "Ks"]
UPCARD = "5c"
DECK = crafted_deck(BIA, ANA, UPCARD)


@pytest.fixture
async def table_client(settings: Settings, clock: Clock) -> AsyncIterator[TestClient]:
    """This module's app deals the crafted deck every hand."""
    shuffle = ScriptedShuffle([(DECK, "0123456789abcdef", 0) for _ in range(20)])
    app = create_app(settings, clock=clock, shuffle=shuffle)
    async with TestClient(ProductionServer(app)) as client:
        yield client


class Seated(msgspec.Struct):
    table_id: str
    ana: str  # seat 0, the dealer
    bia: str  # seat 1, decides first
    invite_code: str

    @property
    def tokens(self) -> list[str]:
        return [self.ana, self.bia]


@pytest.fixture
async def seated(api: Api) -> Seated:
    ana, bia = api.token("Ana"), api.token("Bia")
    created = await api.create(ana)
    status, body = await api.call(
        "POST",
        f"/v1/tables/{created['table_id']}/join",
        bia,
        {"invite_code": created["invite_code"]},
    )
    assert status == 200, body
    seated = Seated(created["table_id"], ana, bia, created["invite_code"])
    view = await api.view(seated.table_id, bia)
    assert view["hand"]["my_cards"] == sorted(BIA, key=_canonical)
    assert view["hand"]["to_act"] == 1
    assert view["hand"]["discard_pile"] == [UPCARD]
    return seated


def _canonical(card: str) -> tuple[int, int]:
    return "cdhs".index(card[1]), "A23456789TJQK".index(card[0])


async def state_of(
    api: Api, db: asyncpg.Connection, table_id: str, tokens: list[str]
) -> dict[str, Any]:
    """Everything a refusal must leave alone: views, event log, outbox, commands, hands."""
    return {
        "public": await api.view(table_id),
        "seats": [await api.view(table_id, token) for token in tokens],
        "events": await all_events(api, table_id),
        "outbox": await db.fetchval(
            "SELECT count(*) FROM outbox WHERE routing_key LIKE $1", f"table.{table_id}.%"
        ),
        "commands": await db.fetchval(
            "SELECT count(*) FROM commands WHERE table_id = $1", table_id
        ),
        "hands": await db.fetchval("SELECT count(*) FROM hands WHERE table_id = $1", table_id),
        "tables": await db.fetchval("SELECT count(*) FROM tables"),
    }


async def refused_unchanged(
    api: Api,
    db: asyncpg.Connection,
    table_id: str,
    tokens: list[str],
    request: Awaitable[tuple[int, Any]],
    status: int,
    code: str,
    rule: str | None,
) -> dict[str, Any]:
    """Send ``request``: refused with this status, code and rule, and nothing changed."""
    before = await state_of(api, db, table_id, tokens)
    got_status, body = await request
    assert_error(got_status, body, status, code, rule)
    after = await state_of(api, db, table_id, tokens)
    assert after == before
    return body  # type: ignore[no-any-return]


def commands_path(table_id: str) -> str:
    return f"/v1/tables/{table_id}/commands"


# --- the body of a command --------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"{", b"not json", b'{"type": "pass_upcard",}', b"\xff\xfe"],
    ids=["truncated", "text", "trailing-comma", "not-utf8"],
)
async def test_malformed_json_is_400(
    api: Api, db: asyncpg.Connection, seated: Seated, raw: bytes
) -> None:
    request = api.call("POST", commands_path(seated.table_id), seated.bia, raw=raw)
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 400, "malformed_json", None
    )


@pytest.mark.parametrize("kind", ["fold", "PASS_UPCARD", "expire", ""])
async def test_unknown_command_type_is_400(
    api: Api, db: asyncpg.Connection, seated: Seated, kind: str
) -> None:
    request = api.command(seated.table_id, seated.bia, type=kind)
    if kind == "expire":  # a timer's command, refused to a person
        await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 403, "not_timer", "R10.3"
        )
    else:
        await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 400, "unknown_command", None
        )


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"type": "draw"},
        {"type": "draw", "source": "deck"},
        {"type": "pass_upcard", "extra": 1},
        {"type": "discard", "card": "Ahhhh"},
        {"type": "pass_upcard", "expected_version": -1},
        [],
    ],
    ids=["no-type", "no-source", "bad-source", "unknown-field", "long-card", "neg-version", "list"],
)
async def test_invalid_command_body_is_400(
    api: Api, db: asyncpg.Connection, seated: Seated, body: Any
) -> None:
    request = api.call("POST", commands_path(seated.table_id), seated.bia, body)
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 400, "invalid_request", None
    )


# --- the rules of a turn ----------------------------------------------------------------------


async def take_upcard(api: Api, seated: Seated) -> dict[str, Any]:
    status, body = await api.command(seated.table_id, seated.bia, type="take_upcard")
    assert status == 200, body
    hand = body["view"]["hand"]
    assert hand["phase"] == "discard"
    assert UPCARD in hand["my_cards"]
    return body["view"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("card", ["Zz", "1h", "Kx", "11c", "h5"])
async def test_r1_2_unknown_card_text_is_400(
    api: Api, db: asyncpg.Connection, seated: Seated, card: str
) -> None:
    await take_upcard(api, seated)
    for kind in ("discard", "knock"):
        request = api.command(seated.table_id, seated.bia, type=kind, card=card)
        await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 400, "unknown_card", "R1.2"
        )


async def test_r5_2_card_not_in_hand(api: Api, db: asyncpg.Connection, seated: Seated) -> None:
    await take_upcard(api, seated)
    for card in ("Ks", "2c", "Ac"):  # two of Ana's cards and one of the stock
        request = api.command(seated.table_id, seated.bia, type="discard", card=card)
        await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 409, "card_not_in_hand", "R5.2"
        )


async def test_r5_4_not_your_turn(api: Api, db: asyncpg.Connection, seated: Seated) -> None:
    for body in (
        {"type": "take_upcard"},
        {"type": "pass_upcard"},
        {"type": "draw", "source": "stock"},
        {"type": "discard", "card": "Ks"},
        {"type": "knock"},
    ):
        request = api.command(seated.table_id, seated.ana, **body)
        await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 409, "not_your_turn", "R5.4"
        )


async def test_r4_1_drawing_while_the_upcard_is_offered(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    request = api.command(seated.table_id, seated.bia, type="draw", source="stock")
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "upcard_pending", "R4.1"
    )


async def test_r5_3_the_upcard_just_taken_cannot_be_discarded(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    view = await take_upcard(api, seated)
    assert {"type": "discard", "card": UPCARD} not in view["legal"]
    for kind in ("discard", "knock"):
        request = api.command(seated.table_id, seated.bia, type=kind, card=UPCARD)
        await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 409, "card_just_taken", "R5.3"
        )


async def test_r5_3_a_card_drawn_from_the_discard_pile_cannot_go_back(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    await take_upcard(api, seated)
    status, body = await api.command(seated.table_id, seated.bia, type="discard", card="Kd")
    assert status == 200, body
    status, body = await api.command(seated.table_id, seated.ana, type="draw", source="discard")
    assert status == 200, body
    assert "Kd" in body["view"]["hand"]["my_cards"]
    assert {"type": "discard", "card": "Kd"} not in body["view"]["legal"]
    request = api.command(seated.table_id, seated.ana, type="discard", card="Kd")
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "card_just_taken", "R5.3"
    )
    # Any other card may go: the refusal was about that card only.
    status, body = await api.command(seated.table_id, seated.ana, type="discard", card="Ks")
    assert status == 200, body


async def test_r6_6_a_knock_over_the_limit_is_refused(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    view = await take_upcard(api, seated)
    hand = view["hand"]
    assert hand["knock_limit"] == 10
    # The SOBRA: the best discard is Kd and leaves 11, one over the limit; no knock is legal.
    assert hand["my_arrangement"]["discard"] == "Kd"
    assert hand["my_arrangement"]["points"] == 11
    assert sorted(hand["my_arrangement"]["deadwood"]) == sorted(["As", "5s", UPCARD])
    assert not [m for m in view["legal"] if m["type"] in ("knock", "big_gin")]
    for body in (
        {"card": "Kd"},
        {},  # the server's own choice of discard (R6.5) leaves 11 as well
        {"card": "Kd", "deadwood": 0},  # the informative deadwood is ignored
        {"card": "5s"},
        {"card": "Kd", "melds": [["4d", "4h", "4s"], ["7h", "8h", "9h", "Th"]]},
        {"card": "Kd", "melds": [["4d", "4h", "4s"]]},
    ):
        request = api.command(seated.table_id, seated.bia, type="knock", **body)
        error = await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 409, "knock_over_limit", "R6.6"
        )
        assert "10" in error["error"]["message"]


async def test_r6_3_big_gin_needs_eleven_melded_cards(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    await take_upcard(api, seated)
    request = api.command(seated.table_id, seated.bia, type="big_gin")
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "not_big_gin", "R6.3"
    )


async def test_r2_1_a_knock_with_a_meld_that_is_not_one(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    await take_upcard(api, seated)
    request = api.command(
        seated.table_id, seated.bia, type="knock", card="Kd", melds=[["4d", "4h", "As"]]
    )
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 400, "invalid_meld", "R2.1"
    )


# --- who may send what ------------------------------------------------------------------------


async def test_r10_1_a_spectator_may_not_play(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    spectator = api.token("Caio")
    for body in ({"type": "pass_upcard"}, {"type": "resign"}, {"type": "leave"}):
        request = api.command(seated.table_id, spectator, **body)
        await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 403, "not_seated", "R10.1"
        )
    assert (await api.view(seated.table_id, spectator))["you"] is None


async def test_tokens_wrong_expired_or_missing_are_401(
    api: Api, db: asyncpg.Connection, seated: Seated, settings: Settings
) -> None:
    bia_id = (await api.view(seated.table_id))["seats"][1]["id"]
    wrong = mint("another-secret-that-is-long-enough-for-hs256", bia_id, "Bia")
    expired = mint(settings.auth_secret, bia_id, "Bia", ttl_s=-(settings.auth_leeway_s + 60))
    for token, headers in (
        (wrong, None),
        (expired, None),
        (None, None),
        ("not-a-jwt", None),
        (None, {"Authorization": f"Token {seated.bia}"}),
        (None, {"Authorization": "Bearer "}),
    ):

        async def send(token: str | None = token, headers: Any = headers) -> tuple[int, Any]:
            if headers is None:
                return await api.command(seated.table_id, token, type="pass_upcard")  # type: ignore[arg-type]
            async with api.client.post(
                commands_path(seated.table_id), json={"type": "pass_upcard"}, headers=headers
            ) as r:
                return r.status, await r.json()

        body = await refused_unchanged(
            api, db, seated.table_id, seated.tokens, send(), 401, "unauthorized", None
        )
        if token is expired:
            assert "expired" in body["error"]["message"]
    # The same command with Bia's real token is accepted: only the token was wrong.
    status, body = await api.command(seated.table_id, seated.bia, type="pass_upcard")
    assert status == 200, body


async def test_tokens_are_checked_on_every_route(api: Api, seated: Seated) -> None:
    expired = mint(
        api.settings.auth_secret, "user-x", "X", ttl_s=-(api.settings.auth_leeway_s + 60)
    )
    t = seated.table_id
    for method, path, body in (
        ("POST", "/v1/tables", {}),
        ("POST", f"/v1/tables/{t}/join", {"invite_code": seated.invite_code}),
        ("POST", f"/v1/tables/{t}/bot", {"level": "tito"}),
        ("GET", f"/v1/tables/{t}", None),
        ("GET", "/v1/players/me/preferences", None),
        ("PUT", "/v1/players/me/preferences", {"deck_design": "classic"}),
    ):
        status, error = await api.call(method, path, expired, body)
        assert_error(status, error, 401, "unauthorized", None)
    for method, path, body in (
        ("POST", "/v1/tables", {}),
        ("POST", f"/v1/tables/{t}/join", {"invite_code": seated.invite_code}),
        ("GET", "/v1/players/me/preferences", None),
    ):
        status, error = await api.call(method, path, None, body)
        assert_error(status, error, 401, "unauthorized", None)


async def test_a_stale_expected_version_is_409(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    version = (await api.view(seated.table_id))["version"]
    for stale in (version - 1, version + 1, 0):
        request = api.command(
            seated.table_id, seated.bia, type="pass_upcard", expected_version=stale
        )
        error = await refused_unchanged(
            api, db, seated.table_id, seated.tokens, request, 409, "stale_version", None
        )
        assert str(version) in error["error"]["message"]
    status, body = await api.command(
        seated.table_id, seated.bia, type="pass_upcard", expected_version=version
    )
    assert status == 200, body
    assert body["version"] == version + 1


async def test_r10_1_a_third_player_cannot_join(
    api: Api, db: asyncpg.Connection, seated: Seated
) -> None:
    third = api.token("Caio")
    request = api.call(
        "POST", f"/v1/tables/{seated.table_id}/join", third, {"invite_code": seated.invite_code}
    )
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "seat_taken", "R10.1"
    )
    # Nor may the creator seat a bot in a taken seat; the third player still watches.
    request = api.call("POST", f"/v1/tables/{seated.table_id}/bot", seated.ana, {"level": "tito"})
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "seat_taken", "R10.1"
    )
    watching = await api.view(seated.table_id, third)
    assert watching["you"] is None
    assert "my_cards" not in watching["hand"]


async def test_r10_1_the_creator_cannot_take_both_seats(api: Api, db: asyncpg.Connection) -> None:
    ana = api.token("Ana")
    created = await api.create(ana)
    table_id = created["table_id"]
    code = {"invite_code": created["invite_code"]}
    request = api.call("POST", f"/v1/tables/{table_id}/join", ana, code)
    await refused_unchanged(api, db, table_id, [ana], request, 409, "already_seated", "R10.1")
    view = await api.view(table_id, ana)
    assert view["status"] == "waiting"
    assert view["seats"][1] is None
    # Bia can still join: the refusal took nothing.
    bia = api.token("Bia")
    status, body = await api.call(
        "POST", f"/v1/tables/{table_id}/join", bia, {"invite_code": created["invite_code"]}
    )
    assert status == 200, body
    assert body["view"]["you"] == 1


async def test_a_bad_invite_code_seats_nobody(api: Api, db: asyncpg.Connection) -> None:
    ana, bia = api.token("Ana"), api.token("Bia")
    created = await api.create(ana)
    table_id = created["table_id"]
    other = await api.create(api.token("Dora"))  # a real code, of another table
    for code in ("nope", created["invite_code"][:-1], other["invite_code"], table_id):
        request = api.call("POST", f"/v1/tables/{table_id}/join", bia, {"invite_code": code})
        await refused_unchanged(api, db, table_id, [ana], request, 403, "bad_invite_code", None)
    for body in ({}, {"invite_code": ""}, {"code": created["invite_code"]}):
        request = api.call("POST", f"/v1/tables/{table_id}/join", bia, body)
        await refused_unchanged(api, db, table_id, [ana], request, 400, "invalid_request", None)
    assert (await api.view(table_id))["status"] == "waiting"


async def test_commands_on_a_waiting_table(api: Api, db: asyncpg.Connection) -> None:
    ana = api.token("Ana")
    table_id = (await api.create(ana))["table_id"]
    request = api.command(table_id, ana, type="pass_upcard")
    await refused_unchanged(api, db, table_id, [ana], request, 409, "waiting_for_opponent", "R10.1")
    request = api.call("POST", f"/v1/tables/{table_id}/bot", api.token("Bia"), {"level": "tito"})
    await refused_unchanged(api, db, table_id, [ana], request, 403, "not_creator", "R10.1")
    request = api.call("POST", f"/v1/tables/{table_id}/bot", ana, {"level": "deep-blue"})
    await refused_unchanged(api, db, table_id, [ana], request, 400, "invalid_request", None)


# --- absence (R10.2) --------------------------------------------------------------------------


async def test_r10_2_absence_claimed_early_then_accepted(
    api: Api, db: asyncpg.Connection, seated: Seated, clock: Clock, settings: Settings
) -> None:
    # Bia has the upcard decision; Ana may claim only after the absence time.
    request = api.command(seated.table_id, seated.ana, type="claim_absence")
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "absence_too_early", "R10.2"
    )
    clock.advance(settings.absence_after_s)  # exactly the absence time: not yet "more than"
    assert {"type": "claim_absence"} not in (await api.view(seated.table_id, seated.ana))["legal"]
    request = api.command(seated.table_id, seated.ana, type="claim_absence")
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "absence_too_early", "R10.2"
    )
    # The absent player cannot claim her own absence.
    request = api.command(seated.table_id, seated.bia, type="claim_absence")
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "not_absent", "R10.2"
    )

    clock.advance(1)
    assert {"type": "claim_absence"} in (await api.view(seated.table_id, seated.ana))["legal"]
    before = await all_events(api, seated.table_id)
    status, body = await api.command(seated.table_id, seated.ana, type="claim_absence")
    assert status == 200, body
    types = [e["type"] for e in body["events"]]
    assert types == ["hand_ended", "match_ended"]
    assert body["events"][0]["data"]["how"] == "abandoned"
    ended = body["events"][1]["data"]
    assert ended["reason"] == "absence"
    assert ended["winner"] == 0
    assert ended["by"] == 1
    assert [t["game_bonus"] + t["box_bonus"] for t in ended["tally"]] == [0, 0]  # R9.3
    assert body["view"]["status"] == "match_over"
    assert body["view"]["match"]["result"] == ended
    after = await all_events(api, seated.table_id)
    assert after[: len(before)] == before
    assert after[len(before) :] == body["events"]


async def test_r10_2_the_absence_clock_restarts_with_each_decision(
    api: Api, db: asyncpg.Connection, seated: Seated, clock: Clock, settings: Settings
) -> None:
    clock.advance(settings.absence_after_s - 5)
    status, body = await api.command(seated.table_id, seated.bia, type="pass_upcard")
    assert status == 200, body  # now Ana decides, from this moment
    clock.advance(10)  # Bia's wait would be over; Ana's has only begun
    request = api.command(seated.table_id, seated.bia, type="claim_absence")
    await refused_unchanged(
        api, db, seated.table_id, seated.tokens, request, 409, "absence_too_early", "R10.2"
    )


# --- unknown tables and bad options -----------------------------------------------------------


async def test_an_unknown_table_is_404(api: Api, seated: Seated) -> None:
    token = seated.bia
    for method, path, body in (
        ("GET", "/v1/tables/no-such-table", None),
        ("GET", "/v1/tables/no-such-table/events", None),
        ("GET", "/v1/tables/no-such-table/ws", None),
        ("POST", "/v1/tables/no-such-table/commands", {"type": "pass_upcard"}),
        ("POST", "/v1/tables/no-such-table/join", {"invite_code": seated.invite_code}),
        ("POST", "/v1/tables/no-such-table/bot", {"level": "tito"}),
    ):
        status, error = await api.call(method, path, token, body)
        assert_error(status, error, 404, "no_such_table", None)
    status, error = await api.call("GET", "/v1/tables/no-such-table/hands/1")
    assert_error(status, error, 404, "no_such_hand", "R11.3")
    # A hand still being played has no public record yet.
    status, error = await api.call("GET", f"/v1/tables/{seated.table_id}/hands/1")
    assert_error(status, error, 404, "no_such_hand", "R11.3")


@pytest.mark.parametrize("query", ["after=-1", "after=x", "limit=0", "after=1.5"], ids=lambda q: q)
async def test_bad_event_queries_are_400(api: Api, seated: Seated, query: str) -> None:
    status, error = await api.call("GET", f"/v1/tables/{seated.table_id}/events?{query}")
    assert_error(status, error, 400, "invalid_request", None)


@pytest.mark.parametrize(
    "options",
    [
        {"target": 0},
        {"target": -5},
        {"target": "100"},
        {"gin_bonus": -1},
        {"undercut_bonus": -25},
        {"big_gin": "yes"},
        {"dealer": "random"},
        {"straight_gin": True, "oklahoma": True},
        {"straight_gin": True, "oklahoma": True, "hollywood": True},
        {"hollywood": "yes"},
        {"knock_limit": 5},
        [],
    ],
    ids=lambda o: msgspec.json.encode(o).decode(),
)
async def test_r9_5_bad_table_options_are_400(
    api: Api, db: asyncpg.Connection, options: Any
) -> None:
    ana = api.token("Ana")
    tables = await db.fetchval("SELECT count(*) FROM tables")
    events = await db.fetchval("SELECT count(*) FROM events")
    outbox = await db.fetchval("SELECT count(*) FROM outbox")
    status, error = await api.call("POST", "/v1/tables", ana, {"options": options})
    assert_error(status, error, 400, "invalid_request", None)
    assert await db.fetchval("SELECT count(*) FROM tables") == tables
    assert await db.fetchval("SELECT count(*) FROM events") == events
    assert await db.fetchval("SELECT count(*) FROM outbox") == outbox


async def test_good_table_options_are_shown_to_everyone(api: Api) -> None:
    options = {"target": 50, "gin_bonus": 20, "dealer": "alternate", "straight_gin": True}
    created = await api.create(api.token("Ana"), options)
    public = await api.view(created["table_id"])
    for name, value in options.items():
        assert public["options"][name] == value
    assert public["options"]["oklahoma"] is False
