"""Table service load (issue 3): concurrent matches over HTTP and WebSockets.

Starts the real table service as a process on this run's own database and broker prefix,
then plays N concurrent matches between random-legal players: each seat reacts to its own
WebSocket (the event and its new view) and sends its command over HTTP. Reports applied
moves per second and the latency from sending a command to the opponent's WebSocket
receiving its first event. In the same run it measures the raw PostgreSQL move transaction
(SELECT FOR UPDATE + UPDATE + INSERT) with as many connections as the service's pool, so the
two figures compare side by side: BENCH_ROUNDS (3) alternating rounds of each, and the
ratio of their medians. Then one round where each player thinks BENCH_THINK_S on average.
Rounds follow each other as production's minutes do: no vacuum, checkpoint or pause between
them (autovacuum runs when it runs), and each reports its worst 5 s window beside the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import msgspec
import uvloop
import yaml

from shared.infra.auth import mint
from shared.infra.compression import GZIP_WBITS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import servers  # noqa: E402
from gin_servers.common import free_port  # noqa: E402

SECRET = "bench-secret-long-enough-for-hs256-signing"
MATCHES = int(os.environ.get("BENCH_MATCHES", "200"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))
THINK_S = float(os.environ.get("BENCH_THINK_S", "1.0"))
POOL_SIZE = int(os.environ.get("BENCH_POOL", "16"))
PHASES = os.environ.get("BENCH_PHASES", "raw,saturated,paced,flood").split(",")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
FLOOD_PER_S = float(os.environ.get("BENCH_FLOOD_PER_S", "500"))
# The flood rounds' players think as the site's do at their quickest (issue 16's paced round).
FLOOD_THINK_S = float(os.environ.get("BENCH_FLOOD_THINK_S", "1.0"))
# The flooder shares the machine's cores with the service; in production it is elsewhere.
# A niceness for it (0: none) tells its own CPU apart from what the service spends on it.
FLOOD_NICE = int(os.environ.get("BENCH_FLOOD_NICE", "0"))
# Pairs of flood rounds per connection count: a round's p99 moves from round to round (a full
# collection, a burst) by more than the difference measured, so one pair is not enough.
FLOOD_ROUNDS = int(os.environ.get("BENCH_FLOOD_ROUNDS", "4"))
# The flooder's keep-alive connections: one set of flood rounds for each count listed. 8: a
# client's few; 100: the most the production ingress lets one address open
# (overlays/prod/ingress.yaml); 1,000: ten addresses' worth, enough to send all 500 a second
# past the holds.
FLOOD_CONNECTIONS = [
    int(n) for n in os.environ.get("BENCH_FLOOD_CONNECTIONS", "8,100,1000").split(",")
]
# synchronous_commit for the flood rounds, on the benchmark's own server: "on" (production's,
# the default) or "off", which sets the commit's flush aside: a flooder's refusals never touch
# the disk, and a disk's slow flushes (deploy/README.md, "The disk and the players' tail")
# fall in the quiet and the flooded rounds at random.
FLOOD_COMMIT = os.environ.get("BENCH_FLOOD_COMMIT", "on")
# As production runs it (deploy/k8s): the table service with GIN_RELAY_APART and its outbox
# relay a process of its own (services.table.relay), counted as the part "relay"; 0: the
# relay inside the service.
RELAY_APART = os.environ.get("BENCH_RELAY_APART", "1") == "1"
# The commands' connections ask for gzip, as every browser does (BENCH_ACCEPT_GZIP=0: they do
# not, as before GIN_HTTP_GZIP existed); the answers are decompressed by the load's process.
ACCEPT_GZIP = os.environ.get("BENCH_ACCEPT_GZIP", "1") == "1"
ACCEPT = b"Accept-Encoding: gzip, deflate, br\r\n" if ACCEPT_GZIP else b""
# How players send their commands: "http" (POST .../commands, as the reference client does) or
# "ws" (a command frame on the table socket each already holds, answered on it).
COMMANDS = os.environ.get("BENCH_COMMANDS", "http")
# Which PostgreSQL: "production" (a throwaway set as production's) or "machine" (bench_servers).
BENCH_POSTGRES = os.environ.get("BENCH_POSTGRES", "production")
PROD_POSTGRES = ROOT / "deploy" / "k8s" / "overlays" / "prod" / "postgres.yaml"
# More of its parameters, "name=value;name=value" (log_min_duration_statement=20, say).
BENCH_PG_SETTINGS = os.environ.get("BENCH_PG_SETTINGS", "")
WINDOW_S = 5.0  # the p99 is also reported per window of this many seconds: the worst one


def cpu_seconds(service_pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) used so far by the service, each PostgreSQL process, each
    RabbitMQ (Erlang) process of the machine and this process (the load: the players, or the
    raw loop's client), by pid: (part, seconds)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for pid, name, fields, entry in proc_stats():
        part = (
            "service"
            if pid == service_pid
            else "relay"
            if name.startswith("python") and _is_relay(entry)
            else "load"
            if pid == os.getpid()
            else "postgresql"
            if name == "postgres"
            else "rabbitmq"
            if name.startswith(("beam", "erl_child"))
            else None
        )
        if part is not None:  # utime and stime: fields 14 and 15 of proc(5)
            found[pid] = (part, (int(fields[11]) + int(fields[12])) / tick)
    return found


def proc_stats() -> Iterator[tuple[int, str, list[str], Path]]:
    """Each process now: its pid, its name, the fields of its ``/proc/<pid>/stat`` after the
    name (the state first: field 3 of proc(5)) and its ``/proc`` entry."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        yield int(entry.name), name, stat[stat.rindex(")") + 2 :].split(), entry


def _is_relay(entry: Path) -> bool:
    try:
        return b"services.table.relay" in (entry / "cmdline").read_bytes()
    except OSError:
        return False


def cpu_per_move(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], moves: int
) -> dict[str, float]:
    """Milliseconds of CPU per applied move, by part, of the processes alive at the end (one
    born meanwhile, a new pool connection's backend, counts whole; one that ended is not
    counted: measure before closing what the round opened)."""
    parts = {"service": 0.0, "postgresql": 0.0, "rabbitmq": 0.0, "load": 0.0}
    if RELAY_APART:
        parts["relay"] = 0.0
    for pid, (part, seconds) in after.items():
        parts[part] += seconds - (before[pid][1] if pid in before else 0.0)
    return {k: round(v * 1000 / max(moves, 1), 3) for k, v in parts.items()}


def machine_cpu() -> tuple[float, float, float]:
    """The machine's CPU seconds so far, all cores: (busy, all, stolen). Busy is everything
    but idle, I/O wait and steal (the kernel's network and disk work included); stolen is the
    time this virtual machine was ready to run but its host ran something else."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle, steal = fields[3] + fields[4], fields[7]
    return (sum(fields) - idle - steal) / tick, sum(fields) / tick, steal / tick


class CpuSpent:
    """What a round cost the machine, measured around it: ``figures(moves)`` gives the CPU
    ms per move by part and in all (the whole machine's busy time), and the machine's busy
    share (near 1: the round was bound by CPU; well below: by something else, the disk's
    flushes say)."""

    def __init__(self, service_pid: int) -> None:
        self.pid = service_pid
        self.parts = cpu_seconds(service_pid)
        self.machine = machine_cpu()

    def figures(self, moves: int) -> dict[str, Any]:
        busy, all_, stolen = (b - a for a, b in zip(self.machine, machine_cpu(), strict=True))
        return {
            "cpu_ms_per_move": cpu_per_move(self.parts, cpu_seconds(self.pid), moves),
            "machine_cpu_ms_per_move": round(busy * 1000 / max(moves, 1), 3),
            "machine_busy_share": round(busy / all_, 3) if all_ else None,
            "machine_stolen_share": round(stolen / all_, 3) if all_ else None,
        }


class FlushProbe:
    """What one durable write cost while a round ran: every ``interval`` s, 8 KiB written and
    ``fdatasync``ed to a file under .run/bench (the disk of the benchmark's PostgreSQL and its
    WAL), from a thread of its own; ``worst_by_window`` gives the slowest of each window (ms).
    A window whose p99 stands far above the others', with a flush as slow, waited on the disk
    (the kernel writing back an earlier round's pages, say), not on the service: a commit
    waits for its WAL's flush."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.path = ROOT / ".run" / "bench" / f"flush-probe-{os.getpid()}"
        self.samples: list[tuple[float, float]] = []  # (when it ended, seconds)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="flush-probe", daemon=True)

    def __enter__(self) -> FlushProbe:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join()
        self.path.unlink(missing_ok=True)

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        block = b"\0" * 8192
        try:
            while not self.stopping.wait(self.interval):
                began = time.perf_counter()
                os.pwrite(fd, block, 0)
                os.fdatasync(fd)
                ended = time.perf_counter()
                self.samples.append((ended, ended - began))
        finally:
            os.close(fd)

    def worst_by_window(self, start: float, end: float) -> list[float]:
        """The slowest flush (ms) of each whole WINDOW_S of [start, end)."""
        worst = [0.0] * int((end - start) // WINDOW_S)
        for at, seconds in self.samples:
            k = int((at - start) // WINDOW_S)
            if 0 <= k < len(worst):
                worst[k] = max(worst[k], round(seconds * 1000, 1))
        return worst


LAG_EDGES = ("0.025", "0.05", "0.1")  # loop lags counted past each, seconds


async def gc_pauses(session: aiohttp.ClientSession, base: str) -> dict[str, tuple[float, float]]:
    """The service's collector pauses so far, by generation: (count, seconds); and under
    "lag>E" its event loop's lags past E seconds so far: (count, 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    found: dict[str, tuple[float, float]] = {}
    lags: dict[str, float] = {}
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "gin_gc_pause_seconds":
                generation = sample.labels.get("generation", "")
                count, seconds = found.get(generation, (0.0, 0.0))
                if sample.name.endswith("_count"):
                    count = sample.value
                elif sample.name.endswith("_sum"):
                    seconds = sample.value
                found[generation] = (count, seconds)
            elif family.name == "gin_event_loop_lag_seconds":
                if sample.name.endswith("_count"):
                    total = sample.value
                elif sample.name.endswith("_bucket") and sample.labels.get("le") in LAG_EDGES:
                    lags[sample.labels["le"]] = sample.value
    found.update({f"lag>{edge}": (total - within, 0.0) for edge, within in lags.items()})
    return found


def emit(**fields: Any) -> None:
    """One result as one JSON line (fields named with a leading ``_`` are left out: the
    samples a later figure is made of)."""
    print(json.dumps({k: v for k, v in fields.items() if not k.startswith("_")}), flush=True)


async def raw_move_rate(
    url: str, seconds: float, connections: int, spent: CpuSpent
) -> tuple[dict[str, Any], float, float]:
    """What the moves cost (``spent``, read before the connections close), moves/s and p50 ms
    of SELECT FOR UPDATE + UPDATE + INSERT on as many rows as tables."""
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
    cost = spent.figures(done)
    async with pool.acquire() as conn:
        await conn.execute("DROP TABLE raw_events, raw_tables")
    await pool.close()
    return cost, rate, statistics.median(times) * 1000


class _Hand(msgspec.Struct):
    to_act: int


class _View(msgspec.Struct):
    """The part of a view a random-legal player reads; its legal moves stay raw JSON."""

    version: int
    status: str
    hand: _Hand | None = None
    legal: list[msgspec.Raw] = []


class _Seq(msgspec.Struct):
    seq: int


class _Result(msgspec.Struct):
    events: list[_Seq]
    view: _View


class _Message(msgspec.Struct):
    kind: str
    event: _Seq | None = None
    view: _View | None = None
    result: _Result | None = None  # a command's answer on the socket (BENCH_COMMANDS=ws)


_message = msgspec.json.Decoder(_Message)
_result = msgspec.json.Decoder(_Result)
# Moves a random player never makes: they end the match or need an absent opponent.
_SKIPPED = (b'"resign"', b'"leave"', b'"claim_absence"')


class Line:
    """One seat's keep-alive HTTP/1.1 connection for its commands: a lean client, as a load
    generator should be (aiohttp's client cost more CPU per request than the service's
    handler, on the cores the service runs on)."""

    def __init__(self, base: str, token: str) -> None:
        self.host, _, port = base.removeprefix("http://").partition(":")
        self.port = int(port)
        self.auth = b"Bearer " + token.encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """Open the connection (``post`` opens it when it is not)."""
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST a JSON body; the status and the body of the answer."""
        if self.writer is None or self.reader is None:
            await self.connect()
        assert self.writer is not None
        assert self.reader is not None
        self.writer.write(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\n%s"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), self.host.encode(), self.auth, ACCEPT, len(body), body)
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        gzipped = False
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
            elif line[:17].lower() == b"content-encoding:":
                gzipped = line[17:].strip().lower() == b"gzip"
        answer = await self.reader.readexactly(length)
        return status, zlib.decompress(answer, GZIP_WBITS) if gzipped else answer

    def close(self) -> None:
        """Close the connection."""
        if self.writer is not None:
            self.writer.close()


class Match:
    """Two random-legal players at one table, each driven by its own WebSocket.

    The player decodes only what it acts on (msgspec Structs, legal moves as raw JSON), so
    the load generator, which shares the machine's cores with the service, stays light.
    """

    def __init__(
        self, base: str, session: aiohttp.ClientSession, n: int, think_s: float = 0.0
    ) -> None:
        self.base = base
        self.think_s = think_s
        self.session = session
        self.n = n
        self.rng = random.Random(n)
        self.tokens = [mint(SECRET, f"p{n}a", "A"), mint(SECRET, f"p{n}b", "B")]
        self.heads = [{"Authorization": f"Bearer {t}"} for t in self.tokens]
        self.lines = [Line(base, t) for t in self.tokens]
        self.table_id = ""
        self.path = ""
        # The first seq of a command's events: when it was sent (by seat), when the opponent's
        # socket got it (by the receiving seat); whichever is known second completes a sample.
        self.sent_at: dict[tuple[int, int], float] = {}
        self.arrived: dict[tuple[int, int], float] = {}
        self.latencies: list[float] = []
        self.completed_at: list[float] = []  # when each latency sample completed
        # Command to its own answer (HTTP, or the socket's result frame), and when each came:
        # a slow answer is the service's or the database's; a slow event after a quick
        # answer, the delivery's.
        self.answers: list[float] = []
        self.answered_at: list[float] = []
        self.moves = 0
        self.errors = 0
        self.acted = [-1, -1]  # the last view version each seat acted on
        self.sockets: dict[int, aiohttp.ClientWebSocketResponse] = {}  # by seat
        self.posted_at = [0.0, 0.0]  # when each seat sent its command on its socket
        self.over = False

    async def setup(self) -> None:
        """Create the table and seat both players."""
        async with self.session.post(f"{self.base}/v1/tables", json={}, headers=self.heads[0]) as r:
            created = await r.json()
        self.table_id = created["table_id"]
        self.path = f"/v1/tables/{self.table_id}/commands"
        body = {"invite_code": created["invite_code"]}
        async with self.session.post(
            f"{self.base}/v1/tables/{self.table_id}/join", json=body, headers=self.heads[1]
        ) as r:
            assert r.status == 200, await r.text()

    async def stop(self) -> None:
        """The time is up: stop acting and close both sockets."""
        self.over = True
        await asyncio.gather(*(ws.close() for ws in self.sockets.values()), return_exceptions=True)

    def close(self) -> None:
        """Close the command connections (once no seat is still posting)."""
        for line in self.lines:
            line.close()

    async def seat(self, seat: int, ready: asyncio.Barrier) -> None:
        """Play one seat until ``stop``: once its snapshot is in, wait at ``ready`` (for every
        socket to have its own) before the first move."""
        url = f"{self.base}/v1/tables/{self.table_id}/ws?token={self.tokens[seat]}"
        async with self.session.ws_connect(url) as ws:
            self.sockets[seat] = ws
            waited = False
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    return
                data = _message.decode(msg.data)
                if not waited:
                    waited = True
                    await ready.wait()
                if data.event is not None:
                    key = (1 - seat, data.event.seq)  # sent by the opponent
                    sent = self.sent_at.pop(key, None)
                    if sent is not None:
                        self._sample(time.perf_counter() - sent)
                    else:
                        self.arrived[key] = time.perf_counter()
                view = data.view
                if data.kind == "result" and data.result is not None:
                    view = self._answered(seat, data.result, self.posted_at[seat])
                elif data.kind == "error":
                    self.errors += 1
                while view is not None and not self.over and self._my_turn(view, seat):
                    view = await self._move(view, seat)

    def _sample(self, latency: float) -> None:
        self.latencies.append(latency)
        self.completed_at.append(time.perf_counter())

    def _my_turn(self, view: _View, seat: int) -> bool:
        """A view that asks this seat to act, newer than any it acted on already."""
        hand = view.hand
        fresh = view.version > self.acted[seat]
        return fresh and hand is not None and hand.to_act == seat and view.status == "playing"

    async def _move(self, view: _View, seat: int) -> _View | None:
        legal = [bytes(m) for m in view.legal]
        move = self.rng.choice([m for m in legal if not any(s in m for s in _SKIPPED)])
        if self.think_s:  # a person takes a moment (uniform, mean think_s)
            await asyncio.sleep(self.rng.uniform(0, 2 * self.think_s))
        self.acted[seat] = view.version
        body = b'%s,"command_id":"%d-%d-%d","expected_version":%d}' % (
            move[:-1],
            self.n,
            seat,
            view.version,
            view.version,
        )
        start = time.perf_counter()
        if COMMANDS == "ws":  # answered on the socket: the seat's loop reads it
            self.posted_at[seat] = start
            frame = b'{"kind":"command","command":%s}' % body
            await self.sockets[seat].send_frame(frame, aiohttp.WSMsgType.TEXT)
            return None
        status, raw = await self.lines[seat].post(self.path, body)
        if status != 200:
            self.errors += 1
            return None
        return self._answered(seat, _result.decode(raw), start)

    def _answered(self, seat: int, result: _Result, start: float) -> _View:
        """A command's answer (sent at ``start``): counted, and its latency sample begun or
        completed; the view it brings."""
        self.moves += 1
        now = time.perf_counter()
        self.answers.append(now - start)
        self.answered_at.append(now)
        if result.events:
            key = (seat, result.events[0].seq)
            arrived = self.arrived.pop(key, None)
            if arrived is not None:
                self._sample(arrived - start)
            else:
                self.sent_at[key] = start
        return result.view


def p99(samples: list[float]) -> float:
    """The 99th percentile of some latencies (ms), rounded."""
    ordered = sorted(samples)
    return round(ordered[int(len(ordered) * 0.99)], 2)


def windows_p99(
    matches: list[Match], start: float, end: float, answers: bool = False
) -> list[float]:
    """The p99 (ms) of the samples completed in each whole WINDOW_S of [start, end) (of the
    command-to-answer samples with ``answers``)."""
    count = int((end - start) // WINDOW_S)
    buckets: list[list[float]] = [[] for _ in range(count)]
    for m in matches:
        samples = (
            zip(m.answered_at, m.answers, strict=True)
            if answers
            else zip(m.completed_at, m.latencies, strict=True)
        )
        for at, latency in samples:
            k = int((at - start) // WINDOW_S)
            if 0 <= k < count:
                buckets[k].append(latency * 1000)
    return [p99(b) for b in buckets if b]


async def play(
    base: str, pid: int, think_s: float, flood_per_s: float = 0.0, flood_connections: int = 8
) -> dict[str, Any]:
    """N matches at once for SECONDS: the service's figures, and what its moves cost the
    machine (``CpuSpent`` over the same SECONDS; ``pid``: the service's). With
    ``flood_per_s``, a non-seated identity floods the first match's table that often, from
    its own process, on ``flood_connections`` connections."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        matches = [Match(base, session, n, think_s) for n in range(MATCHES)]
        for i in range(0, MATCHES, 20):
            await asyncio.gather(*(m.setup() for m in matches[i : i + 20]))
        # Play starts once all sockets are open: 400 connections in one burst are not play,
        # and a real site's players do not all arrive in the same second.
        ready = asyncio.Barrier(2 * MATCHES + 1)  # every seat, and this
        gc.collect()  # nor should this process's own collector pause its players mid-run
        gc.freeze()
        seats = [asyncio.ensure_future(m.seat(s, ready)) for m in matches for s in (0, 1)]
        await asyncio.wait_for(ready.wait(), 120)
        flooder = None
        if flood_per_s:
            flooder = await asyncio.create_subprocess_exec(
                *(["nice", "-n", str(FLOOD_NICE)] if FLOOD_NICE else []),
                sys.executable,
                "-m",
                "bench.flood",
                base,
                matches[0].table_id,
                str(SECONDS),
                str(flood_per_s),
                str(flood_connections),
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
            )
            assert flooder.stdout is not None  # its start-up and connections are no flood
            await asyncio.wait_for(flooder.stdout.readline(), 60)
        collected = await gc_pauses(session, base)
        spent = CpuSpent(pid)
        with FlushProbe() as probe:
            start = time.perf_counter()
            moved = sum(m.moves for m in matches)
            await asyncio.sleep(SECONDS)
            end = time.perf_counter()
        # The round's moves: not those before it, nor those while the flooder ends.
        moves = sum(m.moves for m in matches) - moved
        cost = spent.figures(moves)
        after = await gc_pauses(session, base)
        elapsed = end - start
        flood: dict[str, Any] = {}
        if flooder is not None:
            out, _ = await flooder.communicate()
            flood = json.loads(out)
        await asyncio.gather(*(m.stop() for m in matches))
        await asyncio.wait_for(asyncio.gather(*seats), 30)
        for m in matches:
            m.close()
    lat = sorted(
        x * 1000
        for m in matches
        for x, at in zip(m.latencies, m.completed_at, strict=True)
        if start <= at < end
    )
    windows = windows_p99(matches, start, end)
    answered = sorted(
        x * 1000
        for m in matches
        for x, at in zip(m.answers, m.answered_at, strict=True)
        if start <= at < end
    )
    return {
        "bench": "table_moves",
        "commands_over": COMMANDS,
        **({"flood": flood} if flood else {}),
        "matches": MATCHES,
        "think_s": think_s,
        "seconds": elapsed,
        "command_to_opponent_ws_p50_ms": round(lat[len(lat) // 2], 2),
        "command_to_opponent_ws_p99_ms": round(lat[int(len(lat) * 0.99)], 2),
        "p99_worst_window_ms": max(windows, default=None),
        "p99_by_window_ms": windows,
        # Command to its own answer: the service's and the database's part of the above.
        "command_to_answer_p50_ms": round(answered[len(answered) // 2], 2),
        "command_to_answer_p99_ms": round(answered[int(len(answered) * 0.99)], 2),
        "answer_p99_by_window_ms": windows_p99(matches, start, end, answers=True),
        # The slowest 8 KiB write + fdatasync on the database's disk in each window.
        "disk_flush_worst_by_window_ms": probe.worst_by_window(start, end),
        # The service's full collections in the round: how many, and their mean pause.
        "service_full_gcs": _delta(collected, after, "2"),
        # Timers of the service's loop that ran late past each edge (ms) in the round.
        "service_loop_lags_over_ms": {
            str(int(float(e) * 1000)): _delta(collected, after, f"lag>{e}")["count"]
            for e in LAG_EDGES
        },
        **cost,
        "refused": sum(m.errors for m in matches),
        "_latencies_ms": lat,
        "n": moves,
        "moves_per_match_min_median_max": [
            min(m.moves for m in matches),
            statistics.median(m.moves for m in matches),
            max(m.moves for m in matches),
        ],
    }


def _delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], gen: str
) -> dict[str, float]:
    count = after.get(gen, (0.0, 0.0))[0] - before.get(gen, (0.0, 0.0))[0]
    seconds = after.get(gen, (0.0, 0.0))[1] - before.get(gen, (0.0, 0.0))[1]
    return {"count": count, "mean_ms": round(seconds * 1000 / count, 2) if count else 0.0}


async def autovacuums(url: str) -> dict[str, int]:
    """How often autovacuum and autoanalyze have run on each table of the service, and
    (``CHECKPOINTS``) how many checkpoints the server has made: its flushes can hold commits."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT relname, autovacuum_count + autoanalyze_count AS n FROM pg_stat_user_tables"
            " WHERE schemaname = 'gin_table'"
        )
        try:  # PostgreSQL 17 moved them to pg_stat_checkpointer
            made = await conn.fetchval("SELECT num_timed + num_requested FROM pg_stat_checkpointer")
        except asyncpg.UndefinedTableError:
            made = await conn.fetchval(
                "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
            )
    finally:
        await conn.close()
    return {row["relname"]: row["n"] for row in rows} | {CHECKPOINTS: made}


CHECKPOINTS = "(checkpoints)"


def measured_round(url: str, base: str, pid: int, *args: Any) -> dict[str, Any]:
    """One round of ``play(base, *args)``, its figures once published, the service's CPU
    over it (``pid``: ms a second), and the tables that autovacuum or autoanalyze went
    through meanwhile and the checkpoints the server made (a stall's usual suspects)."""
    before = asyncio.run(autovacuums(url))
    cpu = cpu_seconds(pid).get(pid, ("service", 0.0))[1]
    began = time.perf_counter()
    figures = asyncio.run(published(url, uvloop.run(play(base, pid, *args))))
    cpu = cpu_seconds(pid).get(pid, ("service", 0.0))[1] - cpu
    figures["service_cpu_ms_per_s"] = round(cpu * 1000 / (time.perf_counter() - began), 1)
    after = asyncio.run(autovacuums(url))
    checkpoints = after.pop(CHECKPOINTS) - before.pop(CHECKPOINTS)
    figures["autovacuumed"] = sorted(t for t, n in after.items() if n > before.get(t, 0))
    figures["checkpoints"] = checkpoints
    return figures


async def published(url: str, figures: dict[str, Any]) -> dict[str, Any]:
    """The figures once every event of the phase is on RabbitMQ: a relay that fell behind
    would leave its work to the next phase, so the rate counts the time to catch up."""
    conn = await asyncpg.connect(url)
    began = time.perf_counter()
    try:
        while await conn.fetchval(  # noqa: ASYNC110 (the outbox is a table, not an event)
            "SELECT EXISTS (SELECT FROM gin_table.outbox WHERE published_at IS NULL)"
        ):
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    drain = time.perf_counter() - began
    seconds = figures.pop("seconds")
    return {
        **figures,
        "per_s": round(figures["n"] / (seconds + drain), 1),
        "outbox_drain_s": round(drain, 2),
    }


def start_service(
    env: dict[str, str], name: str, module: str = "services.table"
) -> subprocess.Popen[bytes]:
    """The table service (or ``module``) as a process, its log in .run/bench/NAME.log (named
    on stderr)."""
    logs = ROOT / ".run" / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    print(f"bench: {module} logs to {log}", file=sys.stderr, flush=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=out,
            preexec_fn=_stop_with_parent,
        )


def _stop_with_parent() -> None:
    """In the child: SIGTERM when the bench dies, however it dies (Linux's PR_SET_PDEATHSIG),
    so that a killed bench leaves no service behind."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


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


class Service(msgspec.Struct):
    """The table service a benchmark runs against: its URL, database URL and process."""

    base: str
    url: str
    proc: subprocess.Popen[bytes]


def production_conf() -> dict[str, str]:
    """PostgreSQL's parameters as production's: the prod overlay's CloudNativePG Cluster's over
    servers.PRODUCTION (durability and autovacuum on, PostgreSQL's defaults, which
    CloudNativePG keeps)."""
    for doc in yaml.safe_load_all(PROD_POSTGRES.read_text()):
        if doc and doc.get("kind") == "Cluster":
            return {**servers.PRODUCTION, **doc["spec"]["postgresql"]["parameters"]}
    raise RuntimeError(f"no CloudNativePG Cluster in {PROD_POSTGRES}")


@contextlib.contextmanager
def bench_servers() -> Iterator[dict[str, str]]:
    """GIN_DATABASE_URL and GIN_AMQP_URL for a benchmark. BENCH_POSTGRES=production (the
    default): a throwaway PostgreSQL of its own, set as production's (``production_conf``),
    stopped and deleted on exit; a machine's server may run otherwise (this project's CI
    machines run theirs with autovacuum off). BENCH_POSTGRES=machine: the configured or
    standard server, as make test uses. RabbitMQ: the configured or standard one."""
    urls = servers.ensure(ROOT / ".run" / "servers")
    if BENCH_POSTGRES == "machine":
        yield urls
        return
    state_dir = ROOT / ".run" / "bench" / f"postgres-{os.getpid()}"
    conf = production_conf() | dict(
        setting.split("=", 1) for setting in BENCH_PG_SETTINGS.split(";") if setting
    )
    entry = servers.start_postgres(
        state_dir, servers.load_state(state_dir), servers.Installer(), 120, conf
    )
    try:
        yield {**urls, "GIN_DATABASE_URL": entry.url}
    finally:
        servers.stop(state_dir)
        kept = ROOT / ".run" / "bench" / "postgres.log"
        shutil.copyfile(Path(entry.root) / "log" / "postgres.log", kept)
        print(f"bench: the benchmark's PostgreSQL logged to {kept}", file=sys.stderr)
        servers.stop(state_dir, purge=True)


@contextlib.contextmanager
def table_service(**settings: str) -> Iterator[Service]:
    """The real table service as a process on a database and broker prefix of its own, run
    as production runs it (JSON lines at info, to .run/bench/; PostgreSQL as ``bench_servers``
    gives it); ready on entry, stopped and its database and broker objects removed on exit.
    ``settings``: more GIN_* variables."""
    with bench_servers() as urls, _table_service(urls, settings) as service:
        yield service


@contextlib.contextmanager
def _table_service(urls: dict[str, str], settings: dict[str, str]) -> Iterator[Service]:
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
        GIN_LOG_LEVEL="info",
        GIN_LOG_FORMAT="json",
        **settings,
    )
    if RELAY_APART:
        env["GIN_RELAY_APART"] = "true"
    proc = start_service(env, name)
    base = f"http://127.0.0.1:{port}"
    relay = None
    try:
        asyncio.run(wait_ready(base, proc))
        if RELAY_APART:
            relay_port = free_port()
            relay = start_service(
                {**env, "GIN_HTTP_PORT": str(relay_port)}, f"{name}-relay", "services.table.relay"
            )
            asyncio.run(wait_ready(f"http://127.0.0.1:{relay_port}", relay))
        yield Service(base=base, url=url, proc=proc)
    finally:
        for each in (relay, proc):
            if each is not None:
                each.send_signal(signal.SIGTERM)
                each.wait(timeout=60)
        asyncio.run(database(admin, name, False))
        asyncio.run(drop_prefix(urls["GIN_AMQP_URL"], f"bench-{name}."))


def main() -> None:
    """Start the service, measure the raw rate and the service side by side, clean up."""
    with table_service(GIN_DB_POOL_SIZE=str(POOL_SIZE)) as service:
        measure(service.base, service.url, service.proc)


async def postgres_settings(url: str) -> dict[str, str]:
    """What the benchmark's PostgreSQL runs with, of what moves its figures."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT name, current_setting(name) AS value FROM pg_settings WHERE name = ANY($1)",
            list(REPORTED_SETTINGS),
        )
    finally:
        await conn.close()
    return {row["name"]: row["value"] for row in rows}


REPORTED_SETTINGS = (
    "server_version",
    "autovacuum",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "shared_buffers",
    "max_connections",
)


def measure(base: str, url: str, proc: subprocess.Popen[bytes]) -> None:
    """Every phase of BENCH_PHASES against the running service."""
    emit(bench="postgres", which=BENCH_POSTGRES, **asyncio.run(postgres_settings(url)))
    raw: list[dict[str, Any]] = []
    saturated: list[dict[str, Any]] = []
    for n in range(ROUNDS):  # side by side, alternating: the machine's drift hits both
        if "raw" in PHASES:
            cost, rate, p50 = asyncio.run(raw_move_rate(url, 10.0, POOL_SIZE, CpuSpent(proc.pid)))
            raw.append({"per_s": round(rate, 1), **cost})
            emit(
                bench="raw_pg_move_tx",
                round=n,
                connections=POOL_SIZE,
                p50_ms=round(p50, 2),
                **raw[-1],
            )
        if "saturated" in PHASES:  # every player answers at once
            saturated.append(measured_round(url, base, proc.pid, 0.0))
            emit(round=n, **saturated[-1])
    if raw and saturated:
        emit(bench="table_vs_raw", rounds=ROUNDS, **side_by_side(raw, saturated))
    if "paced" in PHASES:  # people: a moment's thought before each move, right after
        emit(**measured_round(url, base, proc.pid, THINK_S))
    if "flood" in PHASES:
        flood_rounds(url, base, proc.pid)


def side_by_side(raw: list[dict[str, Any]], saturated: list[dict[str, Any]]) -> dict[str, Any]:
    """The saturated service's rate over the raw loop's (medians), and the ratio the machine's
    CPU alone would allow: the raw loop's CPU per move over the service's (all processes
    counted, the load's too). Where the raw loop leaves the CPU idle (its busy share well below
    the service's: it waits on the disk's flushes), the first ratio is above the second."""

    def median(rounds: list[dict[str, Any]], field: str) -> float:
        return float(statistics.median(r[field] for r in rounds))

    raw_rate, table_rate = median(raw, "per_s"), median(saturated, "per_s")
    raw_cpu = median(raw, "machine_cpu_ms_per_move")
    table_cpu = median(saturated, "machine_cpu_ms_per_move")
    return {
        "raw_median_per_s": round(raw_rate, 1),
        "table_median_per_s": round(table_rate, 1),
        "ratio": round(table_rate / raw_rate, 3),
        "raw_machine_busy_share_median": median(raw, "machine_busy_share"),
        "table_machine_busy_share_median": median(saturated, "machine_busy_share"),
        "raw_machine_cpu_ms_per_move_median": raw_cpu,
        "table_machine_cpu_ms_per_move_median": table_cpu,
        "cpu_bound_ratio": round(raw_cpu / table_cpu, 3) if table_cpu else None,
    }


async def synchronous_commit(url: str, value: str) -> str:
    """Set the server's synchronous_commit (every session, at once: a reload), unless the
    server is not the benchmark's own; what it is then."""
    conn = await asyncpg.connect(url)
    try:
        if BENCH_POSTGRES == "production":  # a throwaway of this run's: ours to set
            await conn.execute(f"ALTER SYSTEM SET synchronous_commit = {value}")
            await conn.execute("SELECT pg_reload_conf()")
            await asyncio.sleep(0.5)  # every backend reads it at its next command
        shown: str = await conn.fetchval("SHOW synchronous_commit")
    finally:
        await conn.close()
    return shown


def flood_rounds(url: str, base: str, pid: int) -> None:
    """For each BENCH_FLOOD_CONNECTIONS count: paced play (BENCH_FLOOD_THINK_S) alone and
    with a non-seated identity offering BENCH_FLOOD_PER_S commands to one of its tables on that
    many connections, alternating ABBA (the machine's drift hits both); the ratio of the
    median p99s, of the p99s of all samples pooled, and of the median worst-window p99s: what
    the flood costs the seated players (synchronous_commit as BENCH_FLOOD_COMMIT says)."""
    commit = asyncio.run(synchronous_commit(url, FLOOD_COMMIT))
    try:
        for connections in FLOOD_CONNECTIONS:
            flood_set(url, base, pid, connections, commit)
    finally:
        asyncio.run(synchronous_commit(url, "on"))


def flood_set(url: str, base: str, pid: int, connections: int, commit: str) -> None:
    """One set of ABBA flood rounds on ``connections``."""
    quiet: list[dict[str, Any]] = []
    flooded: list[dict[str, Any]] = []
    for n in range(FLOOD_ROUNDS):
        pair = [(0.0, quiet), (FLOOD_PER_S, flooded)]
        for rate, rounds in pair if n % 2 == 0 else pair[::-1]:  # ABBA: neither first
            figures = measured_round(url, base, pid, FLOOD_THINK_S, rate, connections)
            rounds.append(figures)
            emit(round=n, phase="flood" if rate else "quiet", **figures)
    emit(
        bench="flood_vs_quiet",
        rounds=FLOOD_ROUNDS,
        flood_per_s=FLOOD_PER_S,
        synchronous_commit=commit,
        flood_connections=connections,
        think_s=FLOOD_THINK_S,
        flooder_nice=FLOOD_NICE,
        flood_answered_per_s=[f["flood"]["per_s"] for f in flooded],
        **_ratio(quiet, flooded, "command_to_opponent_ws_p99_ms", "p99"),
        # Every round's samples together: a p99 of all of a side's latencies, steadier than
        # the median of the rounds' p99s (a round's moves a lot on its own).
        **_pooled(quiet, flooded),
        **_ratio(quiet, flooded, "p99_worst_window_ms", "worst_window_p99"),
        # What the flood costs the service itself: its CPU in flooded and quiet rounds.
        service_cpu_ms_per_s_quiet=[f["service_cpu_ms_per_s"] for f in quiet],
        service_cpu_ms_per_s_flooded=[f["service_cpu_ms_per_s"] for f in flooded],
    )


def _pooled(quiet: list[dict[str, Any]], flooded: list[dict[str, Any]]) -> dict[str, Any]:
    a = p99([x for f in quiet for x in f["_latencies_ms"]])
    b = p99([x for f in flooded for x in f["_latencies_ms"]])
    return {
        "quiet_pooled_p99_ms": a,
        "flooded_pooled_p99_ms": b,
        "pooled_p99_ratio": round(b / a, 3),
    }


def _ratio(
    quiet: list[dict[str, Any]], flooded: list[dict[str, Any]], field: str, name: str
) -> dict[str, Any]:
    a = statistics.median(f[field] for f in quiet)
    b = statistics.median(f[field] for f in flooded)
    return {
        f"quiet_{name}_median_ms": a,
        f"flooded_{name}_median_ms": b,
        f"{name}_ratio": round(b / a, 3),
    }


async def drop_prefix(amqp_url: str, prefix: str) -> None:
    import aio_pika

    from shared.infra import amqp

    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await amqp.delete_topology(await connection.channel(), prefix)


if __name__ == "__main__":
    main()
