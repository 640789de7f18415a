"""Idle spectators (issue 16): how many table WebSockets one table process holds, what each
costs it, how fast they open, and how fast one move reaches every watcher of its table.

Starts the real table service as a process on this run's own database and broker prefix,
seats two players at BENCH_WATCH_TABLES (150) tables, then BENCH_WATCH_PROCS (2) processes of
``bench.watchers`` open BENCH_WATCH_SOCKETS (15,000) anonymous sockets between them, spread
over the tables. Reported: the opening rate (sockets over the time from the first handshake
to the last snapshot), the service's resident memory per socket, and then, with every socket
open, one move at each table, BENCH_WATCH_MOVES_PER_S (50) a second: the time from sending
the move to each watcher of its table reading the event (p50, p99, worst), and any watcher
that did not get it.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.table_load import (
    ROOT,
    SECRET,
    emit,
    gc_pauses,
    table_service,
)
from shared.infra.auth import mint

TABLES = int(os.environ.get("BENCH_WATCH_TABLES", "150"))
SOCKETS = int(os.environ.get("BENCH_WATCH_SOCKETS", "15000"))
PROCS = int(os.environ.get("BENCH_WATCH_PROCS", "2"))
MOVES_PER_S = float(os.environ.get("BENCH_WATCH_MOVES_PER_S", "50"))
PLAIN = ("pass_upcard", "take_upcard", "draw", "discard")


def rss_kib(pid: int) -> int:
    """A process's resident memory, KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Table:
    """A table with two seated players; ``move`` makes whoever is to act move."""

    def __init__(self, session: aiohttp.ClientSession, base: str, n: int) -> None:
        self.session, self.base = session, base
        self.tokens = [mint(SECRET, f"w{n}a", "A"), mint(SECRET, f"w{n}b", "B")]
        self.table_id = ""

    def _auth(self, seat: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[seat]}"}

    async def setup(self) -> None:
        async with self.session.post(f"{self.base}/v1/tables", json={}, headers=self._auth(0)) as r:
            created = await r.json()
        self.table_id = created["table_id"]
        url = f"{self.base}/v1/tables/{self.table_id}/join"
        body = {"invite_code": created["invite_code"]}
        async with self.session.post(url, json=body, headers=self._auth(1)) as r:
            assert r.status == 200, await r.text()

    async def move(self) -> tuple[int, float]:
        """One move by the seat to act: its first event's seq and when it was sent."""
        url = f"{self.base}/v1/tables/{self.table_id}"
        async with self.session.get(url) as r:
            seat = (await r.json())["hand"]["to_act"]
        async with self.session.get(url, headers=self._auth(seat)) as r:
            view = await r.json()
        command = next(m for m in view["legal"] if m["type"] in PLAIN)
        sent = time.monotonic()
        async with self.session.post(
            f"{url}/commands", json=command, headers=self._auth(seat)
        ) as r:
            result = await r.json()
            assert r.status == 200, result
        return result["events"][0]["seq"], sent


async def run(base: str, pid: int) -> dict[str, Any]:
    """Tables, then the watchers, then a move at each table; the figures."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as session:
        tables = [Table(session, base, n) for n in range(TABLES)]
        for i in range(0, TABLES, 25):
            await asyncio.gather(*(t.setup() for t in tables[i : i + 25]))
        ids = [t.table_id for t in tables]
        before = rss_kib(pid)
        moves_s = len(tables) / MOVES_PER_S
        watchers = []
        for k in range(PROCS):  # each its share of the sockets, over every table
            share = SOCKETS // PROCS + (1 if k < SOCKETS % PROCS else 0)
            env = dict(os.environ, BENCH_WATCH_SOCKETS=str(share))
            watchers.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.watchers",
                    base,
                    str(moves_s + 10.0),
                    *ids[k::PROCS] if PROCS <= TABLES else ids,
                    cwd=ROOT,
                    env=env,
                    stdout=asyncio.subprocess.PIPE,
                    limit=1 << 26,  # the arrivals come as one line
                )
            )
        opened = []
        for proc in watchers:
            assert proc.stdout is not None
            opened.append(json.loads(await proc.stdout.readline()))
        after = rss_kib(pid)
        began, done = min(o["began"] for o in opened), max(o["at"] for o in opened)
        count = sum(o["opened"] for o in opened)
        sent: dict[tuple[str, int], float] = {}
        start = time.monotonic()
        for k, table in enumerate(tables):  # paced: the k-th move at k / MOVES_PER_S
            await asyncio.sleep(max(0.0, start + k / MOVES_PER_S - time.monotonic()))
            seq, at = await table.move()
            sent[(table.table_id, seq)] = at
        latencies: list[float] = []
        for proc in watchers:
            assert proc.stdout is not None
            arrivals = json.loads(await proc.stdout.readline())["arrivals"]
            await proc.wait()
            for table_id, by_seq in arrivals.items():
                for seq, times in by_seq.items():
                    at = sent.get((table_id, int(seq)))
                    if at is not None:
                        latencies += [(t - at) * 1000 for t in times]
        latencies.sort()
        collected = await gc_pauses(session, base)
        full = collected.get("2", (0.0, 0.0))
        return {
            "bench": "idle_spectators",
            "tables": TABLES,
            "sockets_asked": SOCKETS,
            "sockets_open": count,
            "failed": sum(o["failed"] for o in opened),
            **next(({"first_failure": o["first_failure"]} for o in opened if o["failed"]), {}),
            "opened_per_s": round(count / (done - began), 1),
            "open_s": round(done - began, 2),
            "service_rss_mib_before_after": [round(before / 1024), round(after / 1024)],
            "kib_per_socket": round((after - before) / max(count, 1), 1),
            "moves": len(sent),
            "moves_per_s": MOVES_PER_S,
            "deliveries": len(latencies),
            "deliveries_missing": count - len(latencies),
            "move_to_watcher_p50_ms": round(statistics.median(latencies), 1) if latencies else None,
            "move_to_watcher_p99_ms": round(latencies[int(len(latencies) * 0.99)], 1)
            if latencies
            else None,
            "move_to_watcher_max_ms": round(latencies[-1], 1) if latencies else None,
            # Every full collection of the service since it started, and its mean pause.
            "service_full_gcs": {
                "count": full[0],
                "mean_ms": round(full[1] * 1000 / full[0], 1) if full[0] else 0.0,
            },
        }


def main() -> None:
    """Start the service, measure, clean up."""
    with table_service() as service:
        emit(**asyncio.run(run(service.base, service.proc.pid)))


if __name__ == "__main__":
    main()
