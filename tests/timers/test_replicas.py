"""Issue 29: the timers find due deadlines in the table service's own rows, and fire them
in order and durably: a replica killed mid-batch loses and repeats nothing, and a table's
announcements keep their timer-stream numbers 1, 2, ... in the order of its decisions."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from prometheus_client import CollectorRegistry

from services.timers import store
from services.timers.app import SCHEMA
from services.timers.deadlines import Durations
from services.timers.firing import Firing
from services.timers.metrics import TimerMetrics
from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra import db
from shared.infra.settings import Settings
from tests.timers.conftest import TimerDb, TimerProcess, put_deadlines, timing

pytestmark = pytest.mark.usefixtures("clean_timers")
TABLES = 400
BATCH = 10
HELD = 25  # the table whose announcement the test holds: the 6th of the third batch


async def announced(tdb: TimerDb, prefix: str) -> list[dict[str, Any]]:
    """The absence_claimable envelopes in the outbox for these tables, in outbox order, each
    with its row's message id."""
    rows = await tdb.conn.fetch(
        "SELECT body, message_id FROM outbox WHERE exchange = $1 ORDER BY id", EVENTS_EXCHANGE
    )
    found = []
    for r in rows:
        body = msgspec.json.decode(r["body"])
        if body["table_id"].startswith(prefix):
            found.append({**body, "message_id": r["message_id"]})
    return found


async def until(check: Any, what: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("stopped_by", ["killed", "frozen"])
async def test_a_replica_killed_or_frozen_mid_batch_loses_and_repeats_nothing(
    settings: Settings, tdb: TimerDb, synthetic: str, tmp_path: Path, stopped_by: str
) -> None:
    """Killed (SIGKILL: its connection closes) or frozen (SIGSTOP: its connection stays open,
    as a paused or cut-off replica's does, so only the server's idle-in-transaction limit,
    ``store.HOLD_MS``, ends its transaction and frees the kind for the other replica)."""
    s = timing(settings, absence_s=60.0, expiry_s=3600.0, timer_batch=BATCH, timer_poll_s=0.05)
    now = datetime.now(UTC)
    first = now - timedelta(minutes=10)
    names = [f"{synthetic}{i:03d}" for i in range(TABLES)]
    # Due absences, oldest first in table order; expiries not due (no command for tables
    # that do not exist). Some tables announced before: their next number follows on.
    await put_deadlines(
        tdb.conn,
        [
            (name, i % 2, first + timedelta(milliseconds=i), 100 + i, now, 200 + i)
            for i, name in enumerate(names)
        ],
    )
    before = {name: i % 3 for i, name in enumerate(names) if i % 3 or i == HELD}
    await tdb.conn.executemany(
        "INSERT INTO announcements (table_id, last_seq) VALUES ($1, $2)", list(before.items())
    )
    fired_count = "SELECT count(*) FROM fired WHERE table_id LIKE $1"

    # The test holds one table's announcement row: the replica firing the third batch waits
    # on it in the middle of its transaction, five announcements of that batch taken already.
    holder = await asyncpg.connect(s.database_url, server_settings={"search_path": SCHEMA})
    one = TimerProcess(s, tmp_path / "timers-1.log")
    two = TimerProcess(s, tmp_path / "timers-2.log")
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.execute(
            "SELECT FROM announcements WHERE table_id = $1 FOR UPDATE", names[HELD]
        )
        holder_pid = holder.get_server_pid()
        await one.start()

        async def waiting() -> list[asyncpg.Record]:
            return await tdb.conn.fetch(
                "SELECT pid, query, state, xact_start FROM pg_stat_activity"
                " WHERE $1 = ANY(pg_blocking_pids(pid))",
                holder_pid,
            )

        await until(waiting, "the first replica never reached the held row")
        [blocked] = await waiting()
        assert "announcements" in blocked["query"], blocked
        assert blocked["xact_start"] is not None
        # Two batches committed, the third one open: killed now, it is killed mid-batch.
        assert await tdb.conn.fetchval(fired_count, synthetic + "%") == 2 * BATCH
        committed = {
            r["table_id"]
            for r in await tdb.conn.fetch(
                "SELECT table_id FROM fired WHERE table_id LIKE $1", synthetic + "%"
            )
        }
        assert committed == set(names[: 2 * BATCH])

        await two.start()
        await asyncio.sleep(0.5)  # the second replica finds the absence scan held, and waits
        assert await tdb.conn.fetchval(fired_count, synthetic + "%") == 2 * BATCH
        if stopped_by == "killed":
            assert await one.kill() == -9
        else:
            assert one.proc is not None
            one.proc.send_signal(signal.SIGSTOP)
        await hold.rollback()  # the replica's statement goes on, then finds no client answer

        async def all_fired() -> bool:
            n: int = await tdb.conn.fetchval(fired_count, synthetic + "%")
            return n == TABLES

        await until(
            all_fired,
            "the surviving replica did not fire every deadline",
            30.0 + store.HOLD_MS / 1000,
        )

        async def all_published() -> bool:
            left: int = await tdb.conn.fetchval(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL"
            )
            return left == 0

        await until(all_published, "the surviving replica's relay did not publish everything")
        assert (
            await tdb.conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", blocked["pid"]
            )
            == 0
        )
        assert await two.stop() == 0, two.output()
    finally:
        if holder.is_in_transaction():
            await holder.execute("ROLLBACK")
        await holder.close()
        for proc in (one, two):
            if proc.proc is not None and proc.proc.returncode is None:
                proc.proc.send_signal(signal.SIGCONT)  # a frozen one stops as it is told
                await proc.stop()

    # Every deadline fired exactly once...
    rows = await tdb.conn.fetch(
        "SELECT table_id, kind, seq, attempts, next_at FROM fired WHERE table_id LIKE $1",
        synthetic + "%",
    )
    assert sorted(r["table_id"] for r in rows) == names
    for r in rows:
        i = int(r["table_id"].removeprefix(synthetic))
        assert (r["kind"], r["seq"], r["attempts"], r["next_at"]) == ("absence", 100 + i, 1, None)
    envelopes = await announced(tdb, synthetic)
    assert len({e["message_id"] for e in envelopes}) == len(envelopes) == TABLES
    assert Counter(e["table_id"] for e in envelopes) == Counter(names)
    # ... with the next number of its table's timer stream: none lost, none taken twice.
    for e in envelopes:
        i = int(e["table_id"].removeprefix(synthetic))
        assert (e["stream"], e["seq"]) == ("timer", before.get(e["table_id"], 0) + 1), e
        assert (e["data"]["seat"], e["data"]["table_seq"]) == (i % 2, 100 + i)
        assert e["id"] == e["message_id"]
    numbers = {
        r["table_id"]: r["last_seq"]
        for r in await tdb.conn.fetch("SELECT table_id, last_seq FROM announcements")
    }
    assert {name: numbers[name] for name in names} == {
        name: before.get(name, 0) + 1 for name in names
    }
    # The survivor fired what the killed one had not committed, the open batch included.
    survivor = {r["table_id"] for r in two.logged("deadline_fired")}
    assert survivor == set(names) - committed


async def test_a_tables_next_decision_is_announced_with_the_next_number(
    settings: Settings, tdb: TimerDb, synthetic: str
) -> None:
    table_id = synthetic + "t"
    durations = Durations(absence_after_s=60.0, expiry_after_s=3600.0)
    now = datetime.now(UTC)
    t1 = now - timedelta(seconds=100)

    async def save(seat: int, since: datetime, seq: int, expiry_seq: int) -> None:
        await put_deadlines(tdb.conn, [(table_id, seat, since, seq, now, expiry_seq)])

    pool = await db.create_pool(settings.database_url, SCHEMA, 2)
    try:
        firing = Firing(
            pool, settings.prefix, time.time, TimerMetrics(CollectorRegistry()), durations
        )
        await save(0, t1, 6, 6)  # the deal: seat 0 to decide
        assert await firing.fire_due("absence") == 1
        assert await firing.fire_due("absence") == 0  # fired: not again
        await save(0, t1, 6, 7)  # a draw: the same decision (the save keeps its seq)
        assert await firing.fire_due("absence") == 0
        # A discard: seat 1 decides, since a moment the last look had passed already
        # (saved late, within LOOK_BACK): still found.
        await save(1, t1 + timedelta(seconds=30), 9, 9)
        assert await firing.fire_due("absence") == 1
        await save(0, t1 + timedelta(seconds=35), 11, 11)
        # replaced before any look: never announced
        await save(1, t1 + timedelta(seconds=38), 13, 13)
        await save(0, t1 + timedelta(seconds=39), 15, 15)
        assert await firing.fire_due("absence") == 1
        await save(1, t1 + timedelta(seconds=40), 17, 17)
        assert await firing.fire_due("absence") == 1
    finally:
        await pool.close()
    envelopes = await announced(tdb, table_id)
    got = [(e["seq"], e["data"]["table_seq"], e["data"]["seat"]) for e in envelopes]
    assert got == [(1, 6, 0), (2, 9, 1), (3, 15, 0), (4, 17, 1)]
    assert [datetime.fromisoformat(e["data"]["since"]) for e in envelopes] == [
        t1,
        t1 + timedelta(seconds=30),
        t1 + timedelta(seconds=39),
        t1 + timedelta(seconds=40),
    ]
    assert len({e["message_id"] for e in envelopes}) == 4
    fired = await tdb.fired(table_id)
    assert (fired["absence"]["seq"], fired["absence"]["attempts"]) == (17, 1)
