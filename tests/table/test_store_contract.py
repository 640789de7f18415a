"""One contract, two table stores (issue 30): PostgreSQL (``PgStore``, in a transaction rolled
back after each test) and its in-memory twin (``InMemoryStore``) answer every question the
same way, as eventsourcing's recorder tests hold each recorder to one suite."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import msgspec
import pytest

from services.table.app import migrate
from services.table.decide import Actor, Decision, decide, opened, sit
from services.table.port import InMemoryStore, PgStore, TableStore
from services.table.store import Attempt, Change, TableRow, change_of
from shared.contracts import commands as c
from shared.contracts.events import Player
from shared.engine import Timing
from shared.infra.auth import Identity
from shared.infra.settings import Settings
from tests.table.test_decide import new_row as blank_row

T0 = datetime(2031, 3, 1, 12, 0, tzinfo=UTC)
TIMING = Timing(T0.timestamp(), 48 * 3600.0, 7 * 86400.0)
ANA, BIA = Identity(id="ana", name="Ana"), Identity(id="bia", name="Bia")


def deal() -> tuple[list[int], str, int]:
    return list(range(52)), "salt", 0


@pytest.fixture(params=["postgres", "memory"])
async def db(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[TableStore]:
    if request.param == "memory":
        yield InMemoryStore()
        return
    await migrate(settings)
    conn = await asyncpg.connect(
        settings.database_url, server_settings={"search_path": "gin_table"}
    )
    transaction = conn.transaction()
    await transaction.start()
    try:
        yield PgStore(conn)
    finally:
        await transaction.rollback()
        await conn.close()


def new_row() -> TableRow:
    return blank_row(f"c-{uuid.uuid4().hex[:10]}")


def change(decision_row: TableRow, decision: Decision, command_id: str | None = None) -> Change:
    """What saving ``decision`` writes (the answer kept under ``command_id``, if given)."""
    encoded, outbox, hands = change_of(
        decision_row.table_id, decision.envelopes, decision.hands, None
    )
    made = Change(
        row=decision.row, envelopes=decision.envelopes, encoded=encoded, outbox=outbox, hands=hands
    )
    if command_id is not None:
        made.command_id, made.actor, made.result = command_id, f"person:{ANA.id}", b'{"ok":1}'
    return made


async def playing(db: TableStore) -> TableRow:
    """A stored table with both seats taken and a hand dealt (version 2)."""
    row = new_row()
    await db.insert_table(row)
    await db.save_change(change(row, opened(row, TIMING, None)))
    stored = await db.read_table(row.table_id)
    assert stored is not None
    seated = sit(stored, Player(id=BIA.id, name=BIA.name), BIA.id, TIMING, deal, None)
    await db.save_change(change(stored, seated))
    after = await db.read_table(row.table_id)
    assert after is not None
    return after


async def test_a_stored_table_reads_back_as_it_was_written(db: TableStore) -> None:
    row = new_row()
    await db.insert_table(row)
    assert await db.read_table(row.table_id) == row
    seating = await db.read_seating(row.table_id)
    assert seating is not None
    assert (seating.invite_code, seating.people, seating.full) == ("code", (ANA.id, None), False)
    assert await db.read_table("nowhere") is None
    assert await db.read_seating("nowhere") is None
    assert await db.lock_for_command("nowhere") is None


async def test_a_saved_change_is_the_table_and_its_numbered_events(db: TableStore) -> None:
    row = await playing(db)
    assert (row.version, row.status) == (2, "playing")
    assert row.state is not None
    assert row.state.hand is not None
    events = [msgspec.json.decode(e) for e in await db.events_after(row.table_id, 0, 100)]
    assert [e["seq"] for e in events] == list(range(1, row.seq + 1))
    assert [e["type"] for e in events[:3]] == ["table_created", "seat_taken", "seat_taken"]
    later = [msgspec.json.decode(e)["seq"] for e in await db.events_after(row.table_id, 3, 2)]
    assert later == [4, 5]
    seating = await db.read_seating(row.table_id)
    assert seating is not None
    assert seating.full


async def test_a_command_result_is_found_again_by_its_actor_only(db: TableStore) -> None:
    row = await playing(db)
    assert row.state is not None
    assert row.state.hand is not None
    seat = row.state.hand.to_act
    mover = [ANA, BIA][seat]
    actor = Actor(kind="person", identity=mover)
    decided = decide(row, actor, c.PassUpcard(), TIMING, deal, None)
    made = change(row, decided, "cmd-1")
    made.actor = actor.label
    await db.save_change(made)
    locked = await db.lock_for_command(row.table_id, "cmd-1", mover.id, actor.label)
    assert locked is not None
    assert (locked.prior, locked.row.version) == ('{"ok":1}', 3)
    other = await db.lock_for_command(row.table_id, "cmd-1", None, "bot:1")
    assert other is not None
    assert other.prior is None


async def test_save_if_current_saves_only_on_the_version_it_was_decided_on(db: TableStore) -> None:
    row = await playing(db)
    assert row.state is not None
    assert row.state.hand is not None
    actor = Actor(kind="person", identity=[ANA, BIA][row.state.hand.to_act])
    first = change(row, decide(row, actor, c.PassUpcard(), TIMING, deal, None))
    again = change(row, decide(row, actor, c.PassUpcard(), TIMING, deal, None))
    on = row.version
    assert await db.save_if_current(
        [Attempt(change=first, version=on, player=None, design=None)]
    ) == {row.table_id}
    assert (
        await db.save_if_current([Attempt(change=again, version=on, player=None, design=None)])
        == set()
    )
    stored = await db.read_table(row.table_id)
    assert stored is not None
    assert stored.version == on + 1


async def test_save_if_current_refuses_a_changed_design_or_a_used_command_id(
    db: TableStore,
) -> None:
    row = await playing(db)
    assert row.state is not None
    assert row.state.hand is not None
    mover = [ANA, BIA][row.state.hand.to_act]
    actor = Actor(kind="person", identity=mover)
    await db.set_deck_design(mover.id, "classic")
    assert await db.deck_design(mover.id) == "classic"
    assert await db.deck_design("nobody") is None
    decided = change(row, decide(row, actor, c.PassUpcard(), TIMING, deal, "classic"))
    stale = Attempt(change=decided, version=row.version, player=mover.id, design="azul")
    assert await db.save_if_current([stale]) == set()
    # a command id the actor used already (saved under the lock) is never saved twice
    used = change(row, decide(row, actor, c.PassUpcard(), TIMING, deal, "classic"), "cmd-9")
    used.actor = actor.label
    await db.save_change(used)
    moved = await db.read_table(row.table_id)
    assert moved is not None
    other = [ANA, BIA][1 - row.state.hand.to_act]
    nxt = decide(moved, Actor(kind="person", identity=other), c.PassUpcard(), TIMING, deal, None)
    repeat = change(moved, nxt, "cmd-9")
    repeat.actor = actor.label
    assert (
        await db.save_if_current(
            [Attempt(change=repeat, version=moved.version, player=None, design=None)]
        )
        == set()
    )
    fresh = change(moved, nxt, "cmd-10")
    fresh.actor = actor.label
    saved = await db.save_if_current(
        [Attempt(change=fresh, version=moved.version, player=None, design=None)]
    )
    assert saved == {moved.table_id}


async def test_save_change_on_a_table_moved_on_is_refused(db: TableStore) -> None:
    row = await playing(db)
    assert row.state is not None
    assert row.state.hand is not None
    actor = Actor(kind="person", identity=[ANA, BIA][row.state.hand.to_act])
    decided = decide(row, actor, c.PassUpcard(), TIMING, deal, None)
    await db.save_change(change(row, decided))
    with pytest.raises(RuntimeError, match="moved on"):
        await db.save_change(change(row, decided))
