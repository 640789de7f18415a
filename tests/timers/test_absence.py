"""R10.2 on time: ``absence_claimable`` once the seat to act has been away past the absence
time, with the table service and the timer service both real and running."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra.settings import Settings
from tests.table.conftest import Clock, Tap, all_events, assert_error, open_api
from tests.timers.conftest import (
    TimerDb,
    metrics_of,
    open_timers,
    parse_time,
    timing,
    until_status,
)

pytestmark = pytest.mark.usefixtures("clean_timers")
ABSENCE_S = 1.5


async def claimable(tap: Tap, table_id: str, within_s: float) -> list[dict[str, Any]]:
    """The ``absence_claimable`` envelopes of one table that arrive within ``within_s``."""
    bodies = await tap.collect(lambda got: any(b["table_id"] == table_id for b in got), within_s)
    return [b for b in bodies if b["table_id"] == table_id]


def can_claim(view: dict[str, Any]) -> bool:
    return {"type": "claim_absence"} in view["legal"]


async def test_r10_2_absence_claimable_arrives_after_the_deadline_and_the_claim_wins(
    settings: Settings, tdb: TimerDb
) -> None:
    s = timing(settings, absence_s=ABSENCE_S, expiry_s=60.0)
    async with (
        open_timers(s) as timers,
        open_api(s, clock=time.time) as api,
        Tap(s, EVENTS_EXCHANGE, "timer.*.absence_claimable") as tap,
    ):
        table_id, ana, bia = await api.table_for_two()
        tokens = [ana, bia]
        n = (await api.view(table_id))["hand"]["to_act"]  # the non-dealer, on the upcard
        d = 1 - n
        status, body = await api.command(table_id, tokens[d], type="claim_absence")
        assert_error(status, body, 409, "absence_too_early", "R10.2")

        # The non-dealer passes: the decision, and its clock, move to the dealer.
        status, body = await api.command(table_id, tokens[n], type="pass_upcard")
        assert status == 200, body
        passed = body["events"][-1]
        assert passed["type"] == "upcard_passed"
        rows = await tdb.deadlines(table_id)
        assert rows["absence"]["seat"] == d
        assert rows["absence"]["seq"] == passed["seq"]

        # The waiting player's table socket will show the notice live.
        socket = await api.client.ws_connect(f"/v1/tables/{table_id}/ws?token={tokens[n]}")
        assert (await socket.receive_json())["kind"] == "snapshot"

        # Before the deadline: no announcement, and the claim is refused.
        assert await claimable(tap, table_id, 0.3) == []
        status, body = await api.command(table_id, tokens[n], type="claim_absence")
        assert_error(status, body, 409, "absence_too_early", "R10.2")
        assert not can_claim(await api.view(table_id, tokens[n]))

        got = await claimable(tap, table_id, 10.0)
        arrived = time.time()
        assert len(got) == 1, got
        [envelope] = got
        assert envelope["type"] == "absence_claimable"
        # The table's timer stream, numbered on its own (issue 15): its first event.
        assert (envelope["stream"], envelope["seq"], envelope["version"]) == ("timer", 1, None)
        assert envelope["data"] == {
            "type": "absence_claimable",
            "seat": d,
            "since": passed["occurred_at"],
            "table_seq": passed["seq"],
        }
        since = parse_time(passed["occurred_at"])
        assert arrived - since > ABSENCE_S
        assert parse_time(envelope["occurred_at"]) - since > ABSENCE_S

        async with asyncio.timeout(10):
            while (live := await socket.receive_json())["event"]["type"] != "absence_claimable":
                pass
        assert live["event"]["id"] == envelope["id"]
        await socket.close()

        # Now the table service agrees, shows it in legal, and the claim wins.
        assert can_claim(await api.view(table_id, tokens[n]))
        assert not can_claim(await api.view(table_id, tokens[d]))
        status, body = await api.command(table_id, tokens[n], type="claim_absence")
        assert status == 200, body
        [ended] = [e["data"] for e in body["events"] if e["type"] == "match_ended"]
        assert (ended["winner"], ended["reason"], ended["by"]) == (n, "absence", d)
        assert body["view"]["status"] == "match_over"

        # The match end clears the absence deadline; the expiry stays (R10.3).
        assert set(await tdb.deadlines(table_id)) == {"expiry"}
        assert await claimable(tap, table_id, 0.5) == []  # announced once
        values = await metrics_of(timers)
        assert values[("gin_timer_deadlines_fired_total", (("kind", "absence"),))] == 1
        lag_count = ("gin_timer_fire_lag_seconds_count", (("kind", "absence"),))
        assert values[lag_count] == 1


async def test_default_durations_with_one_clock_moved_by_hand(
    settings: Settings, tdb: TimerDb
) -> None:
    """48 h and 7 days (the defaults), both services reading the same hand-moved clock."""
    clock = Clock()
    s = msgspec.structs.replace(settings, timer_poll_s=0.05, relay_poll_s=0.1)
    assert (s.absence_after_s, s.expiry_after_s) == (48 * 3600.0, 7 * 86400.0)
    async with (
        open_timers(s, clock),
        open_api(s, clock) as api,
        Tap(s, EVENTS_EXCHANGE, "timer.*.absence_claimable") as tap,
    ):
        table_id, ana, bia = await api.table_for_two()
        tokens = [ana, bia]
        n = (await api.view(table_id))["hand"]["to_act"]

        clock.advance(48 * 3600)  # exactly 48 h: a claim needs more (R10.2)
        assert await claimable(tap, table_id, 0.5) == []
        status, body = await api.command(table_id, tokens[1 - n], type="claim_absence")
        assert_error(status, body, 409, "absence_too_early", "R10.2")

        clock.advance(1)
        got = await claimable(tap, table_id, 5.0)
        assert [g["data"]["seat"] for g in got] == [n]
        status, body = await api.command(table_id, tokens[1 - n], type="claim_absence")
        assert status == 200, body

        clock.advance(7 * 86400 + 1)  # a finished match's table expires and keeps its result
        view = await until_status(api, table_id, "expired")
        assert view["status"] == "expired"
        events = await all_events(api, table_id)
        assert events[-1]["type"] == "table_expired"
        [ended] = [e["data"] for e in events if e["type"] == "match_ended"]
        assert (ended["winner"], ended["reason"]) == (1 - n, "absence")
        status, body = await api.command(table_id, tokens[1 - n], type="rematch")
        assert_error(status, body, 409, "table_closed", "R10.3")
