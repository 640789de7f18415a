"""Turn reminders (issue 33, part 2): the timer service sends ``turn_reminder`` at each offset
of ``GIN_TURN_REMINDERS_S`` into a turn and when the absence becomes claimable (R10.2), once
each, none for a turn that has moved on, and as durably as the absence itself: a restart misses
none and sends none twice; two replicas send each once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from services.timers.app import create_app
from services.timers.deadlines import BadReminders, reminder_offsets
from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra.settings import Settings
from tests.table.conftest import Clock, Tap, open_api
from tests.timers.conftest import ROOT, TimerDb, metrics_of, open_timers, put_deadlines, timing

pytestmark = pytest.mark.usefixtures("clean_timers")
DAY = 86400


def at(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock.now, UTC)


async def heard(tap: Tap, table_id: str, count: int, within_s: float = 10.0) -> list[Any]:
    """The table's timer events on the tap, once ``count`` of them have come (a repeat of one,
    by id, counts once); then whatever else comes within half a second."""

    def mine(bodies: list[Any]) -> list[Any]:
        return [b for b in bodies if b["table_id"] == table_id]

    bodies = await tap.collect(lambda got: len({b["id"] for b in mine(got)}) >= count, within_s)
    return mine(bodies + await tap.drain(0.5))


def described(events: list[Any]) -> list[tuple[Any, ...]]:
    """(type, seat, reminder, after_s) of each event, repeats by id dropped."""
    seen: set[str] = set()
    out = []
    for e in events:
        if e["id"] not in seen:
            seen.add(e["id"])
            data = e["data"]
            out.append((e["type"], data["seat"], data.get("reminder"), data.get("after_s")))
    return out


async def reminder_rows(tdb: TimerDb, prefix: str) -> Counter[tuple[str, str]]:
    """The reminders in the timer service's outbox for these tables: (table, message id)."""
    rows = await tdb.conn.fetch(
        "SELECT body, message_id FROM outbox WHERE exchange = $1", EVENTS_EXCHANGE
    )
    found: Counter[tuple[str, str]] = Counter()
    for r in rows:
        body = msgspec.json.decode(r["body"])
        if body["type"] == "turn_reminder" and body["table_id"].startswith(prefix):
            found[(body["table_id"], r["message_id"])] += 1
    return found


async def test_each_offset_once_then_the_claimable_one_also_on_the_socket(
    settings: Settings, tdb: TimerDb
) -> None:
    """The defaults (24 h, 44 h; absence 48 h) with the real table service, one hand-moved
    clock for both; the other seat's table socket gets each reminder too."""
    clock = Clock()
    s = msgspec.structs.replace(settings, timer_poll_s=0.05, relay_poll_s=0.1)
    assert s.turn_reminders_s == "86400,158400"
    async with (
        open_timers(s, clock) as timers,
        open_api(s, clock) as api,
        Tap(s, EVENTS_EXCHANGE, "timer.*.*") as tap,
    ):
        table_id, ana, bia = await api.table_for_two()
        tokens = [ana, bia]
        view = await api.view(table_id)
        n = view["hand"]["to_act"]  # the non-dealer, on the upcard, since the deal
        dealt = (await tdb.deadlines(table_id))["absence"]
        socket = await api.client.ws_connect(f"/v1/tables/{table_id}/ws?token={tokens[1 - n]}")
        assert (await socket.receive_json())["kind"] == "snapshot"

        clock.advance(DAY - 1)  # not yet
        assert await heard(tap, table_id, 1, within_s=1.0) == []
        clock.advance(2)
        [first] = await heard(tap, table_id, 1)
        assert (first["type"], first["stream"], first["seq"]) == ("turn_reminder", "timer", 1)
        since = dealt["since"].astimezone(UTC)
        assert first["data"] == {
            "type": "turn_reminder",
            "seat": n,
            "since": since.isoformat().replace("+00:00", "Z"),
            "waited_s": pytest.approx(DAY + 1, abs=0.01),
            "claimable_at": (since + timedelta(hours=48)).isoformat().replace("+00:00", "Z"),
            "reminder": "waiting",
            "after_s": DAY,
            "table_seq": dealt["seq"],
        }
        async with asyncio.timeout(10):  # the watching seat's socket gets it too
            while (frame := await socket.receive_json())["event"]["type"] != "turn_reminder":
                pass
        assert frame["event"]["id"] == first["id"]

        clock.advance(44 * 3600 - DAY)  # 44 h
        second = await heard(tap, table_id, 1)
        clock.advance(4 * 3600 + 1)  # past 48 h: claimable
        last = await heard(tap, table_id, 2)
        clock.advance(DAY)
        assert await heard(tap, table_id, 1, within_s=1.0) == []  # nothing more
        assert described(second + last) == [
            ("turn_reminder", n, "waiting", 158400),
            ("absence_claimable", n, None, None),
            ("turn_reminder", n, "claimable", 172800),
        ]
        assert [e["seq"] for e in second + last] == [2, 3, 4]  # the timer stream, no gaps
        await socket.close()

        values = await metrics_of(timers)
        sent = "gin_timer_reminders_sent_total"
        for reminder in ("86400", "158400", "claimable"):
            assert values[(sent, (("reminder", reminder),))] == 1, reminder
        assert values[("gin_timer_reminders_skipped_total", (("reminder", "86400"),))] == 0
        fired = ("gin_timer_deadlines_fired_total", (("kind", "reminder:86400"),))
        assert values[fired] == 1


async def test_none_for_a_turn_that_moved_on(settings: Settings, tdb: TimerDb) -> None:
    clock = Clock()
    s = msgspec.structs.replace(settings, timer_poll_s=0.05, relay_poll_s=0.1)
    async with (
        open_timers(s, clock),
        open_api(s, clock) as api,
        Tap(s, EVENTS_EXCHANGE, "timer.*.turn_reminder") as tap,
    ):
        table_id, ana, bia = await api.table_for_two()
        tokens = [ana, bia]
        n = (await api.view(table_id))["hand"]["to_act"]
        clock.advance(DAY + 1)
        assert described(await heard(tap, table_id, 1)) == [("turn_reminder", n, "waiting", DAY)]

        # The seat acts: the decision, and its clock, go to the other seat.
        status, body = await api.command(table_id, tokens[n], type="pass_upcard")
        assert status == 200, body
        clock.advance(44 * 3600 - DAY)  # the first turn's 44 h: it is over, nothing
        assert await heard(tap, table_id, 1, within_s=1.5) == []
        clock.advance(DAY - (44 * 3600 - DAY) + 1)  # past the new turn's 24 h
        assert described(await heard(tap, table_id, 1)) == [
            ("turn_reminder", 1 - n, "waiting", DAY)
        ]


async def test_a_restart_misses_none_and_sends_none_twice(
    settings: Settings, tdb: TimerDb, synthetic: str
) -> None:
    """The service stopped and started between due times (a hand-moved clock), with due
    times passing while none runs."""
    clock = Clock()
    s = timing(settings, absence_s=300.0, expiry_s=DAY * 30.0, turn_reminders_s="100,200")
    table_id = synthetic + "restart"
    since = at(clock)
    await put_deadlines(tdb.conn, [(table_id, 1, since, 7, since, 7)])
    async with open_timers(s, clock):  # nothing due yet (and the topology declared)
        pass
    async with Tap(s, EVENTS_EXCHANGE, "timer.*.*") as tap:
        got = []
        async with open_timers(s, clock):
            clock.advance(101)
            got += await heard(tap, table_id, 1)
        async with open_timers(s, clock):  # started again, nothing new due: nothing
            got += await heard(tap, table_id, 1, within_s=1.5)
        clock.advance(100)  # 201 s: the second reminder is due while none runs
        async with open_timers(s, clock):
            got += await heard(tap, table_id, 1)
        clock.advance(100)  # 301 s: claimable, while none runs
        async with open_timers(s, clock):
            got += await heard(tap, table_id, 2)
    assert described(got) == [
        ("turn_reminder", 1, "waiting", 100),
        ("turn_reminder", 1, "waiting", 200),
        ("absence_claimable", 1, None, None),
        ("turn_reminder", 1, "claimable", 300),
    ]
    assert sorted({e["seq"] for e in got}) == [1, 2, 3, 4]
    rows = await reminder_rows(tdb, table_id)
    assert len(rows) == 3  # three reminders, each fired once
    assert set(rows.values()) == {1}


async def test_after_a_long_stop_only_the_latest_due_reminder_goes(
    settings: Settings, tdb: TimerDb, synthetic: str
) -> None:
    """Down across several due times: one reminder per turn, the latest (the others are
    recorded, not sent)."""
    clock = Clock()
    s = timing(settings, absence_s=300.0, expiry_s=DAY * 30.0, turn_reminders_s="100,200")
    async with open_timers(s, clock):  # the topology declared, before the tap binds
        pass
    now = at(clock)
    fresh, older, oldest = (synthetic + name for name in ("fresh", "older", "oldest"))
    await put_deadlines(
        tdb.conn,
        [
            (fresh, 0, now - timedelta(seconds=150), 3, now, 3),  # past 100 only
            (older, 1, now - timedelta(seconds=250), 4, now, 4),  # past 100 and 200
            (oldest, 0, now - timedelta(seconds=350), 5, now, 5),  # past all: claimable
        ],
    )
    async with Tap(s, EVENTS_EXCHANGE, "timer.*.*") as tap, open_timers(s, clock) as timers:
        bodies = await tap.collect(lambda got: len(got) >= 4)
        bodies += await tap.drain(0.5)
        got = {
            t: described([b for b in bodies if b["table_id"] == t]) for t in (fresh, older, oldest)
        }
        values = await metrics_of(timers)
    assert got == {
        fresh: [("turn_reminder", 0, "waiting", 100)],
        older: [("turn_reminder", 1, "waiting", 200)],
        oldest: [
            ("absence_claimable", 0, None, None),
            ("turn_reminder", 0, "claimable", 300),
        ],
    }
    sent, skipped = "gin_timer_reminders_sent_total", "gin_timer_reminders_skipped_total"
    assert [values[(sent, (("reminder", r),))] for r in ("100", "200", "claimable")] == [1, 1, 1]
    assert [values[(skipped, (("reminder", r),))] for r in ("100", "200")] == [2, 1]


async def test_two_replicas_send_each_reminder_once(
    settings: Settings, tdb: TimerDb, synthetic: str
) -> None:
    clock = Clock()
    s = timing(
        settings,
        absence_s=300.0,
        expiry_s=DAY * 30.0,
        turn_reminders_s="100,200",
        timer_batch=7,
        timer_poll_s=0.02,
    )
    since = at(clock)
    tables = [f"{synthetic}{i:02d}" for i in range(40)]
    await put_deadlines(
        tdb.conn,
        [
            (t, i % 2, since + timedelta(milliseconds=i), 10 + i, since, 10)
            for i, t in enumerate(tables)
        ],
    )
    async with open_timers(s, clock) as one, open_timers(s, clock) as two:
        for offset in (100, 200):
            clock.now = since.timestamp() + offset + 1
            deadline = time.monotonic() + 20
            while len(await reminder_rows(tdb, synthetic)) < 40 * offset // 100:
                assert time.monotonic() < deadline, "the reminders were not all sent"
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a late repeat would be in the outbox by now
        rows = await reminder_rows(tdb, synthetic)
        assert len(rows) == 80
        assert set(rows.values()) == {1}
        assert Counter(t for t, _ in rows) == dict.fromkeys(tables, 2)
        total: Counter[str] = Counter()
        for replica in (one, two):
            values = await metrics_of(replica)
            for r in ("100", "200"):
                total[r] += values[("gin_timer_reminders_sent_total", (("reminder", r),))]
        assert total == {"100": 40, "200": 40}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "above 0"),
        ("-5", "above 0"),
        ("1.5", "whole number"),
        ("abc", "whole number"),
        ("86400,,158400", "whole number"),
        ("158400,86400", "increase"),
        ("86400,86400", "increase"),
        ("172800", "absence time"),
        ("86400,200000", "absence time"),
    ],
)
def test_a_bad_reminders_setting_is_refused(value: str, says: str) -> None:
    with pytest.raises(BadReminders, match=says):
        reminder_offsets(value, 172800.0)
    with pytest.raises(BadReminders, match="GIN_TURN_REMINDERS_S"):
        create_app(Settings(turn_reminders_s=value))


def test_good_reminders_settings() -> None:
    assert reminder_offsets("86400,158400", 172800.0) == (86400, 158400)
    assert reminder_offsets(" 60 , 120 ", 180.0) == (60, 120)
    assert reminder_offsets("", 180.0) == ()  # no reminders at all


def test_the_service_refuses_to_start_with_a_bad_setting() -> None:
    env = {
        **os.environ,
        "GIN_TURN_REMINDERS_S": "158400,86400",
        "GIN_HTTP_PORT": "1",  # never reached
        "GIN_LOG_FORMAT": "json",
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.timers"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines  # one line, no traceback
    line = msgspec.json.decode(lines[0])
    assert line["event"] == "refusing_to_start"
    assert "GIN_TURN_REMINDERS_S='158400,86400'" in line["reason"]
    assert "increase" in line["reason"]
