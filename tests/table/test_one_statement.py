"""A person's command in one statement (issue 16): applied to the table's remembered row and
saved only if the table is still at that version and the mover's deck design unchanged; any
other case takes the locked way, which answers exactly as before (docs/DESIGN.md section 2)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from aiohttp.test_utils import TestClient

from shared.infra.ops import REGISTRY
from shared.infra.settings import Settings
from tests.table.conftest import (
    Api,
    Clock,
    SeededShuffle,
    all_events,
    open_api,
    play_to_the_end,
)


def ways(api: Api) -> dict[str, float]:
    """The table service's count of commands by the way they took."""
    client: TestClient = api.client
    registry = client.app[REGISTRY]
    found = {}
    for way in ("one_statement", "locked"):
        value = registry.get_sample_value("gin_command_ways_total", {"way": way})
        found[way] = value or 0.0
    return found


def without_ids(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events as the game sees them: no envelope id, no table id."""
    return [{k: v for k, v in e.items() if k not in ("id", "table_id")} for e in events]


async def test_a_match_is_played_mostly_in_one_statement_with_the_same_log_as_locked(
    settings: Settings,
) -> None:
    """The same match (same deals, same clock, same moves) through a replica that remembers
    rows and one that does not: the same event log and the same final view, and the first
    takes one statement for all but each player's first command."""
    logs, finals, counts = [], [], []
    for kept in (20_000, 0):
        s = msgspec.structs.replace(settings, table_rows_kept=kept)
        async with open_api(s, clock=Clock(), shuffle=SeededShuffle(11)) as api:
            table_id, ana, bia = await api.table_for_two({"target": 10})
            final = await play_to_the_end(api, table_id, [ana, bia], seed=3)
            logs.append(without_ids(await all_events(api, table_id)))
            finals.append({k: v for k, v in final.items() if k != "table_id"})
            counts.append(ways(api))
    assert logs[0] == logs[1]
    assert finals[0] == finals[1]
    fast, slow = counts
    assert slow["one_statement"] == 0
    assert fast["locked"] == 2  # each player's first command: their deck design is read
    assert fast["one_statement"] == slow["locked"] - 2 > 10


async def test_a_commit_at_another_replica_sends_the_next_command_the_locked_way(
    settings: Settings,
) -> None:
    async with open_api(settings) as a, open_api(settings) as b:
        table_id, ana, bia = await a.table_for_two()
        tokens = [ana, bia]
        for api in (a, a, a, a, b, a, a, b, b, a):  # at either replica, stale or not
            seat = (await api.view(table_id))["hand"]["to_act"]
            view = await api.view(table_id, tokens[seat])
            move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
            status, body = await api.command(
                table_id, tokens[seat], **move, expected_version=view["version"]
            )
            assert status == 200, body
            assert body["version"] == view["version"] + 1
        log = await all_events(a, table_id)
        assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
        assert ways(a) == {"one_statement": 3, "locked": 4}  # first moves, and after b's


async def test_a_deck_design_chosen_at_another_replica_is_in_the_next_answer(
    settings: Settings,
) -> None:
    async with open_api(settings) as a, open_api(settings) as b:
        # Players of their own: a deck design is kept in the run's database for good.
        tokens = [a.token(name, sub=f"design-{uuid.uuid4().hex}") for name in ("Ana", "Bia")]
        created = await a.create(tokens[0])
        table_id = created["table_id"]
        status, body = await a.call(
            "POST",
            f"/v1/tables/{table_id}/join",
            tokens[1],
            {"invite_code": created["invite_code"]},
        )
        assert status == 200, body

        async def move(api: Api) -> dict[str, Any]:
            seat = (await api.view(table_id))["hand"]["to_act"]
            view = await api.view(table_id, tokens[seat])
            m = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
            status, body = await api.command(table_id, tokens[seat], **m)
            assert status == 200, body
            return body  # type: ignore[no-any-return]

        for _ in range(4):  # both players' designs and the row are remembered at a
            await move(a)
        before = ways(a)["one_statement"]
        for token in tokens:
            status, _ = await b.call(
                "PUT", "/v1/players/me/preferences", token, {"deck_design": "classic"}
            )
            assert status == 200
        answer = await move(a)
        assert answer["view"]["deck_design"] == "classic"
        assert ways(a)["one_statement"] == before  # the remembered design was refused


async def test_a_command_sent_again_answers_its_first_result_and_applies_once(
    api: Api,
) -> None:
    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    for _ in range(4):  # the row and both designs remembered
        seat = (await api.view(table_id))["hand"]["to_act"]
        view = await api.view(table_id, tokens[seat])
        m = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
        status, body = await api.command(table_id, tokens[seat], **m)
        assert status == 200, body
    seat = (await api.view(table_id))["hand"]["to_act"]
    view = await api.view(table_id, tokens[seat])
    m = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
    first = await api.command(table_id, tokens[seat], **m, command_id="again-1")
    again = await api.command(table_id, tokens[seat], **m, command_id="again-1")
    assert first[0] == again[0] == 200
    assert again[1] == first[1]
    assert (await api.view(table_id))["version"] == first[1]["version"]
