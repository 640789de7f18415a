"""Idle spectators (issues 16 and 31): how many table WebSockets one table process holds, what
each costs it, how fast they open, and how fast one move reaches every watcher of its table;
for plain sockets and for sockets that negotiated permessage-deflate, as every browser offers.

One round per way in BENCH_WATCH_WAYS ("plain,deflate"), in that order, each on a fresh table
service: it starts the real table service as a process on its own database and broker
prefix, seats two players at BENCH_WATCH_TABLES (150) tables, then BENCH_WATCH_PROCS (2)
processes of ``bench.watchers`` open BENCH_WATCH_SOCKETS (15,000) anonymous sockets between
them, spread over the tables; in the ``deflate`` way each offers
``permessage-deflate; client_max_window_bits`` as Chrome does, and reads compressed frames
as the service's answer says (with or without context takeover). Reported per way (one JSON
line, "way"): the opening rate (sockets over the time from the first handshake to the last
snapshot), the service's resident memory per socket, and then, with every socket open, one
move at each table, BENCH_WATCH_MOVES_PER_S (50) a second: the time from sending the move to
each watcher of its table reading the event (p50, p99, worst), and any watcher that did not
get it; the extension the service answered, the event frames' bytes on the wire and inflated
(their ratio), how many data frames came compressed and how many plain; and the service's CPU
(user + system, /proc) from just before the first move to the last watcher's report, in all
and per delivery.

With both ways, a last line ("spectators_deflate_vs_plain") sets them side by side: memory
per socket, opening rate, p99, the ratio of the CPU per delivery (deflate over plain) and of
the p99, and issue 31's goals as booleans: at most 30 KB (30,000 bytes) per idle deflate
socket, a fan-out's CPU at most 1.3 times the plain one.
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
WAYS = [w.strip() for w in os.environ.get("BENCH_WATCH_WAYS", "plain,deflate").split(",") if w]
# Issue 31's goals for sockets that negotiated permessage-deflate.
GOAL_BYTES_PER_DEFLATE_SOCKET = 30_000  # "at most 30 KB per idle spectator"
GOAL_FANOUT_CPU_RATIO = 1.3  # "a fan-out's CPU at most 1.3 times the plain one"
PLAIN = ("pass_upcard", "take_upcard", "draw", "discard")


def rss_kib(pid: int) -> int:
    """A process's resident memory, KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far, user + system (fields 14 and 15 of proc(5))."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summed(counts: list[dict[str, Any]]) -> dict[str, Any]:
    """The watcher processes' ``Counts`` added up; the first extension and error seen."""
    total: dict[str, Any] = {}
    for one in counts:
        for key, value in one.items():
            if isinstance(value, int):
                total[key] = total.get(key, 0) + value
            elif total.get(key) is None:
                total[key] = value
    return total


def ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
    """a / b rounded, or None if either is missing or b is 0."""
    return round(a / b, digits) if a is not None and b else None


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


async def run(base: str, pid: int, way: str) -> dict[str, Any]:
    """Tables, then the watchers (offering deflate in the ``deflate`` way), then a move at
    each table; the figures."""
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
            env = dict(
                os.environ,
                BENCH_WATCH_SOCKETS=str(share),
                BENCH_WATCH_DEFLATE="1" if way == "deflate" else "0",
            )
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
        cpu_before = cpu_s(pid)
        start = time.monotonic()
        for k, table in enumerate(tables):  # paced: the k-th move at k / MOVES_PER_S
            await asyncio.sleep(max(0.0, start + k / MOVES_PER_S - time.monotonic()))
            seq, at = await table.move()
            sent[(table.table_id, seq)] = at
        latencies: list[float] = []
        reports = []
        for proc in watchers:
            assert proc.stdout is not None
            reports.append(json.loads(await proc.stdout.readline()))
        cpu = cpu_s(pid) - cpu_before  # the moves and their fan-out (and the idle sockets)
        for proc, report in zip(watchers, reports, strict=True):
            arrivals = report["arrivals"]
            await proc.wait()
            for table_id, by_seq in arrivals.items():
                for seq, times in by_seq.items():
                    moved = sent.get((table_id, int(seq)))
                    if moved is not None:
                        latencies += [(t - moved) * 1000 for t in times]
        latencies.sort()
        collected = await gc_pauses(session, base)
        full = collected.get("2", (0.0, 0.0))
        counts = summed([r["counts"] for r in reports])
        events = counts["events"]
        bytes_per_socket = (after - before) * 1024 / max(count, 1)
        return {
            "bench": "idle_spectators",
            "way": way,
            "extension": next((o["extension"] for o in opened if o["extension"]), None),
            "deflate_sockets": sum(o["deflate_sockets"] for o in opened),
            "no_context_takeover_sockets": sum(o["no_takeover_sockets"] for o in opened),
            "tables": TABLES,
            "sockets_asked": SOCKETS,
            "sockets_open": count,
            "failed": sum(o["failed"] for o in opened),
            **next(({"first_failure": o["first_failure"]} for o in opened if o["failed"]), {}),
            "opened_per_s": round(count / (done - began), 1),
            "open_s": round(done - began, 2),
            "service_rss_mib_before_after": [round(before / 1024), round(after / 1024)],
            "kib_per_socket": round((after - before) / max(count, 1), 1),
            "_bytes_per_socket": bytes_per_socket,
            "moves": len(sent),
            "moves_per_s": MOVES_PER_S,
            "deliveries": len(latencies),
            "deliveries_missing": count - len(latencies),
            "move_to_watcher_p50_ms": round(statistics.median(latencies), 1) if latencies else None,
            "move_to_watcher_p99_ms": round(latencies[int(len(latencies) * 0.99)], 1)
            if latencies
            else None,
            "move_to_watcher_max_ms": round(latencies[-1], 1) if latencies else None,
            # The frames the watchers read: data frames compressed (RSV1) and plain, the table
            # events' payload bytes as they came on the wire and as read (inflated).
            "frames_compressed": counts["messages_compressed"],
            "frames_plain": counts["messages_plain"],
            "event_frames": events,
            "event_frames_compressed": counts["events_compressed"],
            "wire_bytes_per_event_frame": round(counts["event_wire_bytes"] / events, 1)
            if events
            else None,
            "bytes_per_event_frame": round(counts["event_bytes"] / events, 1) if events else None,
            "event_compression_ratio": ratio(counts["event_bytes"], counts["event_wire_bytes"]),
            "compression_ratio_all_frames": ratio(counts["bytes"], counts["wire_bytes"]),
            "protocol_errors": counts["protocol_errors"],
            **(
                {"first_protocol_error": counts["first_protocol_error"]}
                if counts["protocol_errors"]
                else {}
            ),
            # The service's CPU from just before the first move to the last watcher's report.
            "service_cpu_s_moves": round(cpu, 2),
            "service_cpu_us_per_delivery": round(cpu * 1e6 / len(latencies), 1)
            if latencies
            else None,
            "_cpu_per_delivery": cpu / len(latencies) if latencies else None,
            # Every full collection of the service since it started, and its mean pause.
            "service_full_gcs": {
                "count": full[0],
                "mean_ms": round(full[1] * 1000 / full[0], 1) if full[0] else 0.0,
            },
        }


def compare(plain: dict[str, Any], deflate: dict[str, Any]) -> dict[str, Any]:
    """The two ways side by side, and issue 31's goals."""
    both = {"plain": plain, "deflate": deflate}
    cpu_ratio = ratio(deflate["_cpu_per_delivery"], plain["_cpu_per_delivery"])
    return {
        "bench": "spectators_deflate_vs_plain",
        "extension": deflate["extension"],
        "kib_per_socket": {way: r["kib_per_socket"] for way, r in both.items()},
        "service_cpu_us_per_delivery": {
            way: r["service_cpu_us_per_delivery"] for way, r in both.items()
        },
        "fanout_cpu_ratio": cpu_ratio,
        "move_to_watcher_p99_ms": {way: r["move_to_watcher_p99_ms"] for way, r in both.items()},
        "p99_ratio": ratio(deflate["move_to_watcher_p99_ms"], plain["move_to_watcher_p99_ms"]),
        "opened_per_s": {way: r["opened_per_s"] for way, r in both.items()},
        "deliveries_missing": {way: r["deliveries_missing"] for way, r in both.items()},
        "kib_per_idle_deflate_socket_le_30": deflate["_bytes_per_socket"]
        <= GOAL_BYTES_PER_DEFLATE_SOCKET,
        "fanout_cpu_ratio_le_1_3": cpu_ratio is not None
        and deflate["_cpu_per_delivery"] / plain["_cpu_per_delivery"] <= GOAL_FANOUT_CPU_RATIO,
    }


def main() -> None:
    """Per way, start a service, measure, clean up; then the two ways compared."""
    unknown = set(WAYS) - {"plain", "deflate"}
    if unknown:
        raise SystemExit(f"BENCH_WATCH_WAYS: unknown ways {sorted(unknown)} (plain, deflate)")
    results: dict[str, dict[str, Any]] = {}
    for way in WAYS:
        with table_service() as service:  # a fresh process: its RSS per socket is this way's
            results[way] = asyncio.run(run(service.base, service.proc.pid, way))
        emit(**results[way])
    if "plain" in results and "deflate" in results:
        emit(**compare(results["plain"], results["deflate"]))


if __name__ == "__main__":
    main()
