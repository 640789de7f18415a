"""Table service load (issue 3): concurrent matches over HTTP and WebSockets.

Starts the real table service as a process on this run's own database and broker prefix,
then plays N concurrent matches between random-legal players: each seat reacts to its own
WebSocket (the event and its new view) and sends its command over HTTP. Reports applied
moves per second and the latency from sending a command to the opponent's WebSocket
receiving its first event. In the same run it measures the raw PostgreSQL move transaction
(SELECT FOR UPDATE + UPDATE + INSERT) with as many connections as the service's pool, so the
two figures compare side by side.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import msgspec
import uvloop

from shared.infra.auth import mint

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import servers  # noqa: E402

SECRET = "bench-secret-long-enough-for-hs256-signing"
MATCHES = int(os.environ.get("BENCH_MATCHES", "200"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))
THINK_S = float(os.environ.get("BENCH_THINK_S", "0.5"))
POOL_SIZE = 16


def emit(**fields: Any) -> None:
    """One result as one JSON line."""
    print(json.dumps(fields), flush=True)


def free_port() -> int:
    """A free local TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def raw_move_rate(url: str, seconds: float, connections: int) -> tuple[float, float]:
    """Moves/s and p50 ms of SELECT FOR UPDATE + UPDATE + INSERT on as many rows as tables."""
    pool = await asyncpg.create_pool(url, min_size=connections, max_size=connections)
    assert pool is not None
    async with pool.acquire() as conn:
        await conn.execute(
            "DROP TABLE IF EXISTS raw_events, raw_tables;"
            "CREATE TABLE raw_tables (id int PRIMARY KEY, state bytea, version int);"
            "CREATE TABLE raw_events (id int, seq int, body jsonb, PRIMARY KEY (id, seq));"
        )
        await conn.executemany(
            "INSERT INTO raw_tables VALUES ($1, $2, 0)", [(i, b"x" * 600) for i in range(MATCHES)]
        )
    done = 0
    times: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        rng = random.Random(k)
        while time.perf_counter() < stop:
            table = rng.randrange(MATCHES)
            start = time.perf_counter()
            async with pool.acquire() as conn, conn.transaction():
                version = await conn.fetchval(
                    "SELECT version FROM raw_tables WHERE id = $1 FOR UPDATE", table
                )
                await conn.execute(
                    "UPDATE raw_tables SET state = $2, version = $3 WHERE id = $1",
                    table,
                    b"y" * 600,
                    version + 1,
                )
                await conn.execute(
                    "INSERT INTO raw_events VALUES ($1, $2, $3::jsonb)",
                    table,
                    version + 1,
                    '{"type": "card_discarded", "card": "Ah"}',
                )
            times.append(time.perf_counter() - start)
            done += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(connections)))
    rate = done / (time.perf_counter() - began)
    async with pool.acquire() as conn:
        await conn.execute("DROP TABLE raw_events, raw_tables")
    await pool.close()
    return rate, statistics.median(times) * 1000


class Match:
    """Two random-legal players at one table, each driven by its own WebSocket."""

    def __init__(
        self, base: str, session: aiohttp.ClientSession, n: int, think_s: float = 0.0
    ) -> None:
        self.base = base
        self.think_s = think_s
        self.session = session
        self.rng = random.Random(n)
        self.tokens = [mint(SECRET, f"p{n}a", "A"), mint(SECRET, f"p{n}b", "B")]
        self.table_id = ""
        # The first seq of a command's events: when it was sent (by seat), when the opponent's
        # socket got it (by the receiving seat); whichever is known second completes a sample.
        self.sent_at: dict[tuple[int, int], float] = {}
        self.arrived: dict[tuple[int, int], float] = {}
        self.latencies: list[float] = []
        self.moves = 0
        self.errors = 0
        self.acted = [-1, -1]  # the last view version each seat acted on

    async def setup(self) -> None:
        """Create the table and seat both players."""
        head = {"Authorization": f"Bearer {self.tokens[0]}"}
        async with self.session.post(f"{self.base}/v1/tables", json={}, headers=head) as r:
            created = await r.json()
        self.table_id = created["table_id"]
        head = {"Authorization": f"Bearer {self.tokens[1]}"}
        body = {"invite_code": created["invite_code"]}
        async with self.session.post(
            f"{self.base}/v1/tables/{self.table_id}/join", json=body, headers=head
        ) as r:
            assert r.status == 200, await r.text()

    async def seat(self, seat: int, until: float) -> None:
        """Play one seat until the time is up."""
        url = f"{self.base}/v1/tables/{self.table_id}/ws?token={self.tokens[seat]}"
        async with self.session.ws_connect(url) as ws:
            while (left := until - time.perf_counter()) > 0:
                try:
                    msg = await ws.receive(timeout=left)
                except TimeoutError:
                    return  # time is up while waiting for the opponent
                if msg.type != aiohttp.WSMsgType.TEXT:
                    return
                data = msgspec.json.decode(msg.data)
                if data["kind"] == "event":
                    key = (1 - seat, data["event"]["seq"])  # sent by the opponent
                    sent = self.sent_at.pop(key, None)
                    if sent is not None:
                        self.latencies.append(time.perf_counter() - sent)
                    else:
                        self.arrived[key] = time.perf_counter()
                view = data.get("view")
                while view and time.perf_counter() < until and self._my_turn(view, seat):
                    view = await self._move(view, seat)

    def _my_turn(self, view: dict[str, Any], seat: int) -> bool:
        """A view that asks this seat to act, newer than any it acted on already."""
        hand = view.get("hand")
        fresh = view["version"] > self.acted[seat]
        return fresh and bool(hand) and hand["to_act"] == seat and view["status"] == "playing"

    async def _move(self, view: dict[str, Any], seat: int) -> dict[str, Any] | None:
        moves = [m for m in view["legal"] if m["type"] not in ("resign", "leave", "claim_absence")]
        move = dict(self.rng.choice(moves), command_id=uuid.uuid4().hex)
        if self.think_s:  # a person takes a moment (uniform, mean think_s)
            await asyncio.sleep(self.rng.uniform(0, 2 * self.think_s))
        move["expected_version"] = view["version"]
        self.acted[seat] = view["version"]
        head = {"Authorization": f"Bearer {self.tokens[seat]}"}
        start = time.perf_counter()
        async with self.session.post(
            f"{self.base}/v1/tables/{self.table_id}/commands",
            data=msgspec.json.encode(move),
            headers=head,
        ) as r:
            body = msgspec.json.decode(await r.read())
        if r.status != 200:
            self.errors += 1
            return None
        self.moves += 1
        if body["events"]:
            key = (seat, body["events"][0]["seq"])
            arrived = self.arrived.pop(key, None)
            if arrived is not None:
                self.latencies.append(arrived - start)
            else:
                self.sent_at[key] = start
        return body["view"]  # type: ignore[no-any-return]


async def play(base: str, think_s: float) -> None:
    """N matches at once for SECONDS; print the service's figures."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        matches = [Match(base, session, n, think_s) for n in range(MATCHES)]
        for i in range(0, MATCHES, 20):
            await asyncio.gather(*(m.setup() for m in matches[i : i + 20]))
        start = time.perf_counter()
        until = start + SECONDS
        tasks = [m.seat(s, until) for m in matches for s in (0, 1)]
        await asyncio.gather(*(asyncio.wait_for(t, SECONDS + 30) for t in tasks))
        elapsed = time.perf_counter() - start
    lat = sorted(x * 1000 for m in matches for x in m.latencies)
    moves = sum(m.moves for m in matches)
    emit(
        bench="table_moves",
        matches=MATCHES,
        think_s=think_s,
        per_s=round(moves / elapsed, 1),
        command_to_opponent_ws_p50_ms=round(lat[len(lat) // 2], 2),
        command_to_opponent_ws_p99_ms=round(lat[int(len(lat) * 0.99)], 2),
        refused=sum(m.errors for m in matches),
        n=moves,
    )


async def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    """Wait for /readyz."""
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError("the table service exited")
            try:
                async with session.get(f"{base}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the table service did not become ready")


async def database(admin: str, name: str, create: bool) -> None:
    """Create or drop the bench database."""
    conn = await asyncpg.connect(admin)
    try:
        if create:
            await conn.execute(f'CREATE DATABASE "{name}"')
        else:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def main() -> None:
    """Start the service, measure the raw rate and the service side by side, clean up."""
    urls = servers.ensure(ROOT / ".run" / "servers")
    name = f"gin_bench_{uuid.uuid4().hex[:8]}"
    admin = urls["GIN_DATABASE_URL"]
    url = admin.rpartition("/")[0] + "/" + name
    asyncio.run(database(admin, name, True))
    port = free_port()
    env = dict(
        os.environ,
        GIN_DATABASE_URL=url,
        GIN_AMQP_URL=urls["GIN_AMQP_URL"],
        GIN_PREFIX=f"bench-{name}.",
        GIN_HTTP_PORT=str(port),
        GIN_AUTH_SECRET=SECRET,
        GIN_LOG_LEVEL="warning",
        GIN_DB_POOL_SIZE=str(POOL_SIZE),
    )
    proc = subprocess.Popen([sys.executable, "-m", "services.table"], env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(base, proc))
        rate, p50 = asyncio.run(raw_move_rate(url, 10.0, POOL_SIZE))
        emit(
            bench="raw_pg_move_tx",
            connections=POOL_SIZE,
            per_s=round(rate, 1),
            p50_ms=round(p50, 2),
        )
        uvloop.run(play(base, 0.0))  # saturation: every player answers at once
        uvloop.run(play(base, THINK_S))  # people: a moment's thought before each move
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        asyncio.run(database(admin, name, False))
        asyncio.run(_drop_prefix(urls["GIN_AMQP_URL"], f"bench-{name}."))


async def _drop_prefix(amqp_url: str, prefix: str) -> None:
    import aio_pika

    from shared.infra import amqp

    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await amqp.delete_topology(await connection.channel(), prefix)


if __name__ == "__main__":
    main()
