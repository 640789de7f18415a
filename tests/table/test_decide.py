"""The table's rules without a database (issue 30): ``decide`` is pure, and ``Tables`` over the
in-memory store answers as it does over PostgreSQL (R10.1, R10.3, command ids)."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from services.table.decide import Actor, Rejected, decide, opened, sit
from services.table.port import InMemoryStore
from services.table.store import TableRow
from services.table.tables import Tables
from shared.contracts import commands as c
from shared.contracts.events import Player
from shared.contracts.options import TableOptions
from shared.engine import IllegalAction, Timing
from shared.infra.auth import Identity

T0 = datetime(2031, 3, 1, 12, 0, tzinfo=UTC)
ANA, BIA, CAIO = (Identity(id=n.lower(), name=n) for n in ("Ana", "Bia", "Caio"))
DAY = 86400.0


def timing(after_s: float = 0.0) -> Timing:
    return Timing(T0.timestamp() + after_s, 2 * DAY, 7 * DAY)


class Deals:
    """A shuffle that counts how often it is asked."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self) -> tuple[list[int], str, int]:
        self.asked += 1
        return list(range(52)), "salt", 0


def new_row(table_id: str = "t-1") -> TableRow:
    """A table as created, before its first change: Ana's, waiting for an opponent."""
    return TableRow(
        table_id=table_id,
        invite_code="code",
        creator_id=ANA.id,
        options=TableOptions(),
        seats=[Player(id=ANA.id, name=ANA.name), None],
        status="waiting",
        state=None,
        version=0,
        seq=0,
        created_at=T0,
        last_move_at=T0,
    )


def waiting() -> TableRow:
    return opened(new_row(), timing(), None).row


def playing() -> TableRow:
    return sit(waiting(), Player(id=BIA.id, name=BIA.name), BIA.id, timing(), Deals(), None).row


def person(who: Identity) -> Actor:
    return Actor(kind="person", identity=who)


def to_act(row: TableRow) -> Identity:
    assert row.state is not None
    assert row.state.hand is not None
    return [ANA, BIA][row.state.hand.to_act]


def test_a_decision_numbers_its_events_at_the_moment_and_leaves_the_row_alone() -> None:
    row = playing()
    before = msgspec.json.encode(row)
    decision = decide(row, person(to_act(row)), c.PassUpcard(), timing(5.0), Deals(), None)
    assert msgspec.json.encode(row) == before  # the loaded row is not changed
    assert decision.row.version == row.version + 1
    assert [e.seq for e in decision.envelopes] == list(range(row.seq + 1, decision.row.seq + 1))
    assert {e.occurred_at for e in decision.envelopes} == {decision.row.last_move_at}
    assert decision.row.last_move_at.timestamp() == timing(5.0).now
    assert decision.view.version == decision.row.version


def test_r10_1_the_match_starts_when_the_second_seat_is_taken_and_deals_once() -> None:
    deals = Deals()
    decision = sit(waiting(), Player(id=BIA.id, name=BIA.name), BIA.id, timing(), deals, None)
    types = [e.type for e in decision.envelopes]
    assert types[:2] == ["seat_taken", "match_started"]
    assert "hand_started" in types
    assert deals.asked == 1
    assert (decision.seat, decision.row.status) == (1, "playing")
    deals = Deals()
    decide(decision.row, person(to_act(decision.row)), c.PassUpcard(), timing(), deals, None)
    assert deals.asked == 0  # no shuffle unless a hand is dealt


def test_r10_1_a_spectator_and_a_stranger_bot_are_refused() -> None:
    row = playing()
    with pytest.raises(Rejected) as spectator:
        decide(row, person(CAIO), c.PassUpcard(), timing(), Deals(), None)
    assert (spectator.value.code, spectator.value.rule) == ("not_seated", "R10.1")
    with pytest.raises(Rejected) as bot:
        decide(row, Actor(kind="bot", seat=1), c.PassUpcard(), timing(), Deals(), None)
    assert bot.value.code == "not_a_bot_seat"


def test_a_stale_expected_version_is_refused() -> None:
    row = playing()
    stale = c.PassUpcard(expected_version=row.version - 1)
    with pytest.raises(Rejected, match=f"at version {row.version}") as refused:
        decide(row, person(to_act(row)), stale, timing(), Deals(), None)
    assert refused.value.code == "stale_version"


def test_r10_3_only_the_timer_expires_and_only_an_idle_table() -> None:
    row = playing()
    with pytest.raises(Rejected) as person_expires:
        decide(row, person(ANA), c.Expire(), timing(), Deals(), None)
    assert person_expires.value.code == "not_timer"
    timer = Actor(kind="timer")
    with pytest.raises(Rejected) as timer_moves:
        decide(row, timer, c.PassUpcard(), timing(), Deals(), None)
    assert timer_moves.value.code == "timer_expires_only"
    with pytest.raises(IllegalAction):
        decide(waiting(), timer, c.Expire(), timing(DAY), Deals(), None)
    expired = decide(waiting(), timer, c.Expire(), timing(7 * DAY + 1), Deals(), None)
    assert ([e.type for e in expired.envelopes], expired.row.status) == (
        ["table_expired"],
        "expired",
    )
    with pytest.raises(Rejected) as closed:
        decide(expired.row, person(ANA), c.Leave(), timing(), Deals(), None)
    assert closed.value.code == "table_closed"


def test_r10_1_a_waiting_table_takes_only_its_creators_leave() -> None:
    with pytest.raises(Rejected) as early:
        decide(waiting(), person(ANA), c.Resign(), timing(), Deals(), None)
    assert early.value.code == "waiting_for_opponent"
    left = decide(waiting(), person(ANA), c.Leave(), timing(), Deals(), None)
    assert left.row.status == "closed"


def test_r10_1_a_full_table_seats_nobody_else() -> None:
    with pytest.raises(Rejected) as full:
        sit(playing(), Player(id=CAIO.id, name=CAIO.name), CAIO.id, timing(), Deals(), None)
    assert full.value.code == "seat_taken"


async def test_tables_over_the_in_memory_store_answer_a_repeated_command_id_once() -> None:
    tables = Tables(
        "https://gin.example", 2 * DAY, 7 * DAY, clock=lambda: T0.timestamp(), shuffle=Deals()
    )
    db = InMemoryStore()
    created, _ = await tables.create(db, ANA, TableOptions())
    table_id = created.table_id
    with pytest.raises(Rejected) as wrong:
        await tables.join(db, table_id, BIA, "not-the-code")
    assert wrong.value.code == "bad_invite_code"
    joined, _ = await tables.join(db, table_id, BIA, created.invite_code)
    row = await db.read_table(table_id)
    assert row is not None
    mover = to_act(row)
    command = c.PassUpcard(command_id="once")
    first, change = await tables.command(db, table_id, person(mover), command)
    again, repeat = await tables.command(db, table_id, person(mover), command)
    assert change is not None
    assert repeat is None
    assert again == first
    stored = await db.read_table(table_id)
    assert stored is not None
    assert stored.version == joined.version + 1
    with pytest.raises(Rejected) as spectator:
        await tables.command(db, table_id, person(CAIO), c.PassUpcard())
    assert spectator.value.code == "not_seated"
    with pytest.raises(Rejected) as nowhere:
        await tables.command(db, "nowhere", person(ANA), c.PassUpcard())
    assert nowhere.value.code == "no_such_table"
