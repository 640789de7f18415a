"""A PostgreSQL failover under play: the table service on a primary and a synchronous standby
(chaos/pgpair.py), reached by a multi-host URL with ``target_session_attrs=read-write`` as
CloudNativePG's ``-rw`` Service reaches the primary.

The primary is killed (-9) and the standby promoted while two replicas serve two matches:
meanwhile every answer is a 200 or a 503 with Retry-After (never another 5xx), a command sent
again with its command_id answers its first result, and afterwards moves go on against the
new primary with every acknowledged move in the log, the relay publishing the outbox (its
lock taken on the new primary) and the rate limits shared through the unlogged table (empty
after the promotion: an unlogged table is not replicated). Then the primary refuses writes
(``default_transaction_read_only``, as a demoted server does): 503s, the pools drop those
connections, and play goes on once it takes writes again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import msgspec
import pytest

from chaos.pgpair import PgPair, servers
from shared.infra import amqp, db, outbox
from shared.infra.settings import Settings
from tests.moves import sobra_move
from tests.table.conftest import Api, all_events, open_api, published

pytestmark = pytest.mark.timeout(120)
DATABASE = "gin_failover"
MOVES_EACH = 8  # acknowledged moves per match before each fault and after it
DETECTION_S = 1.0  # from the primary's death to the promotion


class Player:
    """Plays both seats of one match, sending a command again (same command_id) while it
    answers 503, and remembers every answer and every acknowledged (seat, version)."""

    def __init__(self, api: Api, table_id: str, tokens: list[str]) -> None:
        self.api = api
        self.table_id = table_id
        self.tokens = tokens
        self.answers: list[tuple[float, int, Any]] = []  # when, status, body
        self.acknowledged: dict[str, tuple[int, int]] = {}  # command_id: (seat, version)
        self.sent: list[tuple[float, float]] = []  # each command's first sending, its answer

    async def call(self, method: str, path: str, token: str, body: Any = None) -> Any:
        while True:
            status, answer = await self.api.call(method, path, token, body)
            self.answers.append((time.monotonic(), status, answer))
            if status != 503:
                assert status == 200, answer
                return answer
            await asyncio.sleep(0.05)

    async def play(self) -> None:
        """Move after move until cancelled (a new match when one ends)."""
        path = f"/v1/tables/{self.table_id}"
        seat = 0
        while True:
            view = await self.call("GET", path, self.tokens[seat])
            if view["status"] != "playing":
                return
            seat = view["hand"]["to_act"]
            if view["you"] != seat:
                view = await self.call("GET", path, self.tokens[seat])
            command_id = f"m-{uuid.uuid4().hex[:12]}"
            body = {**sobra_move(view), "command_id": command_id}
            sent_at = time.monotonic()
            result = await self.call("POST", f"{path}/commands", self.tokens[seat], body)
            self.acknowledged[command_id] = (seat, result["version"])
            self.sent.append((sent_at, time.monotonic()))

    def acked_since(self, at: float) -> int:
        return sum(1 for when, status, body in self.answers if when >= at and status == 200
                   and isinstance(body, dict) and "version" in body)  # fmt: skip


def _mover(data: dict[str, Any]) -> int | None:
    """The seat an event names as the one who acted, if any."""
    for field in ("seat", "knocker"):
        if data.get(field) is not None:
            return int(data[field])
    return None


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[PgPair]:
    pair = PgPair(tmp_path / "pgpair", synchronous=True)
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture
async def failover_settings(pair: PgPair, settings: Settings) -> AsyncIterator[Settings]:
    servers.create_database(pair.admin_url, DATABASE)
    own = msgspec.structs.replace(
        settings,
        database_url=pair.url_for(DATABASE),
        prefix=f"{settings.prefix}pgfo-{uuid.uuid4().hex[:6]}.",
        db_acquire_timeout_s=1.0,
    )
    try:
        yield own
    finally:
        connection = await aio_pika.connect(own.amqp_url)
        async with connection:
            await amqp.delete_topology(await connection.channel(), own.prefix)


async def until(what: str, done: Any, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        await asyncio.sleep(0.05)


async def test_a_failover_under_play_answers_503_and_loses_no_acknowledged_move(
    pair: PgPair, failover_settings: Settings
) -> None:
    s = failover_settings
    async with open_api(s) as one, open_api(s) as two:
        players = []
        for api in (one, two):
            table_id, a, b = await api.table_for_two()
            players.append(Player(api, table_id, [a, b]))
        playing = [asyncio.create_task(p.play()) for p in players]
        try:
            await until("play", lambda: all(p.acked_since(0) >= MOVES_EACH for p in players), 20)

            # kill -9 of the primary, promotion of the standby, the old one back as standby
            killing_at = time.monotonic()
            await asyncio.to_thread(pair.kill_primary)
            killed_at = time.monotonic()
            await asyncio.sleep(DETECTION_S)  # a failover manager's time to decide
            await asyncio.to_thread(pair.promote_standby)
            promoted_s = time.monotonic() - killed_at
            await asyncio.to_thread(pair.rejoin_old_primary)
            rejoined_s = time.monotonic() - killed_at
            await until(
                "play after the failover",
                lambda: all(p.acked_since(killed_at) >= MOVES_EACH for p in players),
                30,
            )
            first_s = min(
                when for p in players for when, status, body in p.answers
                if when >= killed_at and status == 200 and "version" in body
            ) - killed_at  # fmt: skip
            # a command first sent after the kill: a commit on the new primary, which waits
            # for the old one to rejoin (a retried one may be answered from before the kill)
            first_new_s = (
                min(acked for p in players for sent, acked in p.sent if sent >= killed_at)
                - killed_at
            )
            failover_503 = sum(
                1 for p in players for when, status, _ in p.answers
                if killing_at <= when <= killed_at + rejoined_s and status == 503
            )  # fmt: skip
            assert failover_503, "no command met the failover"

            # the primary refuses writes, as a demoted server does; then takes them again
            primary = pair.primary()
            read_only = "ALTER SYSTEM SET default_transaction_read_only = on"
            for sql in (read_only, "SELECT pg_reload_conf()"):
                assert servers.psql_query(pair.node_url(primary), sql).returncode == 0
            refused_at = time.monotonic()
            await until(
                "a 503 from the read-only primary",
                lambda: any(
                    when >= refused_at and status == 503
                    for p in players for when, status, _ in p.answers
                ),
                10,
            )  # fmt: skip
            for sql in (
                "ALTER SYSTEM RESET default_transaction_read_only",
                "SELECT pg_reload_conf()",
            ):
                assert servers.psql_query(pair.node_url(primary), sql).returncode == 0
            writable_at = time.monotonic()
            await until(
                "play after read-only",
                lambda: all(p.acked_since(writable_at) >= MOVES_EACH for p in players),
                20,
            )
        finally:
            for task in playing:
                task.cancel()
            await asyncio.gather(*playing, return_exceptions=True)

        answers = [(status, body) for p in players for _, status, body in p.answers]
        assert [a for a in answers if a[0] >= 500 and a[0] != 503] == []
        for status, body in answers:
            if status == 503:
                assert body["error"]["code"] in ("database_unavailable", "busy"), body
        for player in players:  # every acknowledged move is in the new primary's log
            events = await all_events(player.api, player.table_id)
            # Who made each logged change: the seat of a pass, draw or discard, the knocker of
            # a knock (its events, hand_ended and the next deal, carry no "seat").
            logged = {(_mover(e["data"]), e["version"]) for e in events}
            missing = {c: v for c, v in player.acknowledged.items() if v not in logged}
            assert not missing, f"acknowledged, then lost: {missing}"
            seqs = [e["seq"] for e in events]
            assert seqs == list(range(1, len(seqs) + 1)), "the log has a gap"

        conn = await asyncpg.connect(s.database_url, server_settings={"search_path": "gin_table"})
        try:
            assert (
                await conn.fetchval("SELECT inet_server_port()")
                == pair.ports()["ab".index(pair.primary())]
            )
            for player in players:  # a relay took the lock on the new primary and publishes
                await published(conn, player.table_id, within_s=15)
            # the rate limits' unlogged table came back empty with the promotion; the
            # replicas' syncs fill it again
            await until_rows(conn, "SELECT count(*) FROM rate_limits WHERE ends_at > $1",
                             time.time())  # fmt: skip
        finally:
            await conn.close()
    print(
        f"\nfailover: promoted {promoted_s:.2f} s after the kill ({DETECTION_S} s of it"
        f" waiting), rejoined at {rejoined_s:.2f} s,"
        f" first answer 200 to a command at {first_s:.2f} s,"
        f" first command sent after the kill acknowledged at {first_new_s:.2f} s,"
        f" {failover_503} answers 503 meanwhile"
    )


async def until_rows(conn: asyncpg.Connection, sql: str, *args: Any) -> None:
    deadline = time.monotonic() + 5
    while not await conn.fetchval(sql, *args):
        assert time.monotonic() < deadline, f"no rows: {sql}"
        await asyncio.sleep(0.1)


async def test_a_refused_write_drops_the_pools_connections(settings: Settings) -> None:
    """25006 is transient (503, a retry) and no connection of the pool is used again: after
    a failover they may all be on a server that is a standby now."""
    pool = await db.create_pool(settings.database_url, "public", 2)
    try:
        async with pool.acquire() as one, pool.acquire() as two:
            before = {one.get_server_pid(), two.get_server_pid()}
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError) as refused:
            async with pool.acquire() as conn, conn.transaction(readonly=True):
                await conn.execute("CREATE TEMP TABLE refused (x int)")
        assert db.transient(refused.value)
        async with pool.acquire() as one, pool.acquire() as two:
            after = {one.get_server_pid(), two.get_server_pid()}
        assert not before & after
    finally:
        await pool.close()
    none_primary = asyncpg.TargetServerAttributeNotMatched("none of the hosts")
    assert db.transient(none_primary)


async def test_the_relay_lock_is_held_no_longer_than_a_batch_may_take(settings: Settings) -> None:
    """The session of a relay cut off mid-batch ends after LOCK_HOLD_S, its lock with it."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with conn.transaction():
            assert await conn.fetchval(outbox._TAKE_LOCK, 28)
            held = await conn.fetchval("SHOW idle_in_transaction_session_timeout")
        assert held == f"{int(outbox.LOCK_HOLD_S)}s"
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
    finally:
        await conn.close()
