"""The deadlines the table saves with each change (issue 29), which the timer service fires:
every way a change is saved writes them, and a table open before migration 009 gets them
filled in from its state (R10.2, R10.3)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from services.table import backfill
from tests.table.conftest import Api, all_events


async def deadlines(db: asyncpg.Connection, table_id: str) -> dict[str, Any]:
    row = await db.fetchrow("SELECT * FROM timer_deadlines WHERE table_id = $1", table_id)
    assert row is not None
    return dict(row)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_r10_2_r10_3_each_change_saves_whose_decision_since_when_and_the_last_move(
    api: Api, db: asyncpg.Connection
) -> None:
    creator = api.token("Caio")
    waiting = (await api.create(creator))["table_id"]
    row = await deadlines(db, waiting)  # nobody joined: only the expiry runs
    created = await all_events(api, waiting)
    assert (row["absence_seat"], row["absence_since"]) == (None, None)
    assert (row["expiry_since"], row["expiry_seq"]) == (
        at(created[-1]["occurred_at"]),
        created[-1]["seq"],
    )

    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    dealt = await all_events(api, table_id)
    [started] = [e for e in dealt if e["type"] == "hand_started"]
    n = (await api.view(table_id))["hand"]["to_act"]
    row = await deadlines(db, table_id)
    assert (row["absence_seat"], row["absence_since"], row["absence_seq"]) == (
        n,
        at(started["occurred_at"]),
        started["seq"],
    )

    # A pass: the decision goes to the other seat, since the pass (the one-statement way or
    # the locked way: both save the deadlines).
    status, body = await api.command(table_id, tokens[n], type="pass_upcard")
    assert status == 200, body
    passed = body["events"][-1]
    row = await deadlines(db, table_id)
    assert (row["absence_seat"], row["absence_since"], row["absence_seq"]) == (
        1 - n,
        at(passed["occurred_at"]),
        passed["seq"],
    )
    assert (row["expiry_since"], row["expiry_seq"]) == (at(passed["occurred_at"]), passed["seq"])

    # The other passes too: the non-dealer draws from the stock (R4.4) ...
    status, body = await api.command(table_id, tokens[1 - n], type="pass_upcard")
    assert status == 200, body
    second = body["events"][-1]
    status, body = await api.command(table_id, tokens[n], type="draw", source="stock")
    assert status == 200, body
    drawn = body["events"][-1]
    row = await deadlines(db, table_id)
    # ... and a draw leaves the decision, its moment and its event as they were; the expiry
    # moves on.
    assert (row["absence_seat"], row["absence_since"], row["absence_seq"]) == (
        n,
        at(second["occurred_at"]),
        second["seq"],
    )
    assert (row["expiry_since"], row["expiry_seq"]) == (at(drawn["occurred_at"]), drawn["seq"])

    # Resigning ends the match: no decision runs; the table stays open for a rematch.
    status, body = await api.command(table_id, tokens[n], type="resign")
    assert status == 200, body
    row = await deadlines(db, table_id)
    assert (row["absence_seat"], row["absence_since"]) == (None, None)
    assert row["expiry_seq"] == body["events"][-1]["seq"]

    # Leaving after the match closes the table: nothing left to fire.
    status, body = await api.command(table_id, tokens[n], type="leave")
    assert status == 200, body
    row = await deadlines(db, table_id)
    assert (row["expiry_since"], row["absence_since"]) == (None, None)


async def test_a_table_open_before_migration_009_gets_its_deadlines_from_its_state(
    api: Api, db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await api.table_for_two()
    n = (await api.view(table_id))["hand"]["to_act"]
    status, body = await api.command(table_id, [ana, bia][n], type="pass_upcard")
    assert status == 200, body
    saved = await deadlines(db, table_id)
    # As 009 leaves a playing table: its expiry from the row, its absence to the service.
    await db.execute(
        "UPDATE deadlines SET absence_seat = NULL, absence_since = NULL, absence_seq = NULL,"
        " backfill = true WHERE table_id = $1",
        table_id,
    )
    while await backfill.fill_in(db, 100):
        pass
    assert await deadlines(db, table_id) == saved
    assert not await db.fetchval("SELECT backfill FROM deadlines WHERE table_id = $1", table_id)
