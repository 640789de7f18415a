"""R10.3 on time: a table with no accepted command for the expiry time expires and closes."""

from __future__ import annotations

import asyncio
import time

import pytest

from shared.infra.settings import Settings
from tests.table.conftest import all_events, assert_error, open_api
from tests.timers.conftest import TimerDb, open_timers, parse_time, timing, until_status

pytestmark = pytest.mark.usefixtures("clean_timers")
EXPIRY_S = 2.0


async def test_r10_3_an_idle_table_expires_with_no_winner_and_refuses_commands(
    settings: Settings, tdb: TimerDb
) -> None:
    s = timing(settings, absence_s=60.0, expiry_s=EXPIRY_S)
    async with open_timers(s), open_api(s, clock=time.time) as api:
        waiting = (await api.create(api.token("Caio")))["table_id"]  # nobody joins
        table_id, ana, bia = await api.table_for_two()
        tokens = [ana, bia]
        n = (await api.view(table_id))["hand"]["to_act"]
        await asyncio.sleep(EXPIRY_S / 2)
        status, body = await api.command(table_id, tokens[n], type="pass_upcard")  # a move
        assert status == 200, body
        last_move = parse_time(body["events"][-1]["occurred_at"])

        await until_status(api, waiting, "expired")
        assert (await api.view(table_id))["status"] == "playing"  # its last move was later
        await until_status(api, table_id, "expired")

        events = await all_events(api, table_id)
        assert [e["type"] for e in events[-3:]] == ["hand_ended", "match_ended", "table_expired"]
        assert events[-3]["data"]["how"] == "abandoned"  # the hand on is revealed
        assert events[-2]["data"]["winner"] is None
        assert events[-2]["data"]["reason"] == "expired"
        idle = parse_time(events[-1]["occurred_at"]) - last_move
        assert EXPIRY_S <= idle < EXPIRY_S + 2.0, idle
        for move in ({"type": "draw", "source": "stock"}, {"type": "resign"}):
            status, body = await api.command(table_id, tokens[1 - n], **move)
            assert_error(status, body, 409, "table_closed", "R10.3")

        # One expiry event type, whether or not a match had started (issue 15).
        closed = await all_events(api, waiting)
        assert closed[-1]["type"] == "table_expired"
        assert closed[-1]["data"] == {"type": "table_expired"}
        waited = parse_time(closed[-1]["occurred_at"]) - parse_time(closed[0]["occurred_at"])
        assert waited >= EXPIRY_S

        # Each table got one expire command, and its end dropped its deadlines.
        for table in (table_id, waiting):
            commands = await tdb.expire_commands(table)
            assert len(commands) == 1, commands
            assert commands[0]["source"] == "timer"
            assert commands[0]["command"]["type"] == "expire"
            assert await tdb.deadlines(table) == {}


async def test_r10_3_a_person_who_sends_the_expire_command_id_does_not_keep_the_table(
    settings: Settings, tdb: TimerDb
) -> None:
    """Command ids are scoped by who sends them: a seated person whose last move carries the
    id of the expiry that move will be due for (``timer:expire:<table>:<seq>``) cannot keep
    the idle table from expiring."""
    s = timing(settings, absence_s=60.0, expiry_s=EXPIRY_S)
    async with open_timers(s), open_api(s, clock=time.time) as api:
        table_id, ana, bia = await api.table_for_two()
        tokens = [ana, bia]
        n = (await api.view(table_id))["hand"]["to_act"]
        last_seq = (await all_events(api, table_id))[-1]["seq"]
        squatted = f"timer:expire:{table_id}:{last_seq + 1}"  # passing the upcard: one event
        status, body = await api.command(
            table_id, tokens[n], type="pass_upcard", command_id=squatted
        )
        assert status == 200, body
        assert [e["seq"] for e in body["events"]] == [last_seq + 1]  # the id of its expiry

        await until_status(api, table_id, "expired")
        commands = await tdb.expire_commands(table_id)
        assert [c["command"]["command_id"] for c in commands] == [squatted]
