"""A season of data behind the move path (issue 32): the table service's moves with months of
finished tables in its database as without them, and the maintenance task on that backlog.

On one run's own database (``table_load.table_service``): BENCH_SEASON_ROUNDS paced rounds
of ``python -m bench table`` (BENCH_MATCHES players thinking BENCH_THINK_S for BENCH_SECONDS)
on the empty database; then a season filled in SQL in the same database, BENCH_SEASON_EVENTS
events (10,000,000) over finished tables spread over the BENCH_SEASON_DAYS (182) before now
(the app's clock), each with 60 to 200 events, their commands and hand records; copies of the
first rounds' stored events and command answers, and of hand records the engine plays, with
their ids, seqs and times varied, so every row has a real one's size. Then as many rounds
again (no VACUUM, ANALYZE or warm-up in between: autovacuum runs as it does), a run of the
maintenance task on the season with the app's clock at its end and a day's retention, the
run after it, and the hot tables' sizes. events.at and commands.answered_at (migrations 010
and 011) are filled where information_schema shows them; a partitioned events table gets the
season's monthly partitions first, as the maintenance task would have made them.

Each step is one JSON line; ``season_goals`` last: p99 and CPU per move with the season over
without it, the maintenance runs' seconds and the commands' rows before and after them.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import structlog
from prometheus_client import CollectorRegistry

from bench.backend import process_times
from bench.table_load import (
    BENCH_POSTGRES,
    POOL_SIZE,
    ROOT,
    THINK_S,
    emit,
    measured_round,
    p99,
    postgres_settings,
    table_service,
)
from services.table import archive, maintenance
from shared.contracts import commands as c
from shared.contracts.events import HandEnded
from shared.contracts.options import TableOptions
from shared.engine import Timing, apply, deal, legal, new_game, to_act
from shared.infra.db import Conn
from shared.infra.settings import Settings

EVENTS = int(os.environ.get("BENCH_SEASON_EVENTS", "10000000"))
DAYS = float(os.environ.get("BENCH_SEASON_DAYS", "182"))
# Paced rounds on each side of the fill: a round's p99 moves from round to round by as much as
# what is measured; the summary pools their samples.
ROUNDS = int(os.environ.get("BENCH_SEASON_ROUNDS", "2"))
RETENTION_S = float(os.environ.get("BENCH_SEASON_RETENTION_S", "86400"))
# The maintenance run archives the tables ended GIN_ARCHIVE_AFTER_S ago, as the app does with
# GIN_ARCHIVE_URL set (to a directory of this run's, removed after); 0: it does not.
ARCHIVE = os.environ.get("BENCH_SEASON_ARCHIVE", "1") == "1"
# The fill's statements, each over a slice of the season's tables (its progress on stderr).
CHUNKS = int(os.environ.get("BENCH_SEASON_CHUNKS", "8"))
SCHEMA = "gin_table"
HOT = ("events", "commands", "hands", "tables")
MEAN_EVENTS = 130  # a season table has 60 + (0..140) events
STEP_S = 8.0  # seconds between a season table's events
EVENTS_PER_HAND = 40
PLAYERS = 50_000  # the season's players, two to a table, so that each plays many
HAND_SAMPLES = 64


def main() -> None:
    """Both rounds, the fill and the maintenance run on one database; the figures."""
    began = time.perf_counter()
    # What the maintenance task logs goes to stderr, beside the bench's own notes: stdout is
    # the JSON lines'.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    # The service's own maintenance runs once at its start (nothing to do yet), then not
    # again: the one run measured is this bench's, at a moment of its choosing.
    with table_service(GIN_DB_POOL_SIZE=str(POOL_SIZE), GIN_MAINTENANCE_EVERY_S="1e9") as service:
        url, base, pid = service.url, service.base, service.proc.pid
        emit(bench="postgres", which=BENCH_POSTGRES, **asyncio.run(postgres_settings(url)))
        without = []
        for n in range(ROUNDS):
            without.append(observed_round(url, base, pid))
            emit(season="without", round=n, **without[-1])
        fill = asyncio.run(fill_season(url, EVENTS, time.time()))
        emit(bench="season_fill", **fill)
        with_ = []
        for n in range(ROUNDS):
            with_.append(observed_round(url, base, pid))
            emit(season="with", round=n, **with_[-1])
        maintained = asyncio.run(maintenance_run(url, time.time()))
        emit(bench="season_maintenance", **maintained)
        summary = goals(without, with_, fill, maintained)
        emit(bench="season_goals", group_s=round(time.perf_counter() - began), **summary)


# --- the rounds ----------------------------------------------------------------------------


def observed_round(url: str, base: str, pid: int) -> dict[str, Any]:
    """The paced round (``table_load.measured_round``), with what this run's PostgreSQL
    spent meanwhile by kind of process (``ServerCpu``), in ms a second of the whole round
    (its set-up and drain included)."""
    postmaster = asyncio.run(postmaster_pid(url))
    running = asyncio.run(autovacuum_running(url))
    began = time.perf_counter()
    with ServerCpu(postmaster) as server:
        figures = measured_round(url, base, pid, THINK_S)
    seconds = time.perf_counter() - began
    figures["autovacuum_running_at_start"] = running
    figures["this_postgresql_cpu_ms_per_s"] = {
        kind: round(spent * 1000 / seconds, 1) for kind, spent in server.by_kind().items()
    }
    return figures


async def postmaster_pid(url: str) -> int:
    """The pid of the server that holds ``url``'s database (a backend's parent)."""
    conn = await asyncpg.connect(url)
    try:
        backend: int = await conn.fetchval("SELECT pg_backend_pid()")
        return process_times()[backend].ppid  # while the backend lives
    finally:
        await conn.close()


class ServerCpu:
    """One PostgreSQL server's CPU seconds by kind of process over a span (a context
    manager): its backends, autovacuum, the writers (checkpointer, background writer, WAL
    writer) and the postmaster. Its processes are read every ``interval`` s, so one that ends
    meanwhile (an autovacuum worker done with its table) counts up to its last reading under
    its kind; what no reading saw (a process born and ended between two, the last moments of
    one that ended) is ``unseen``, from the postmaster's reaped-children time."""

    def __init__(self, postmaster: int, interval: float = 1.0) -> None:
        self.postmaster = postmaster
        self.interval = interval
        self.first: dict[int, float] = {}  # own seconds at the start, of those alive then
        self.last: dict[int, tuple[str, float]] = {}  # kind and own seconds when last read
        self.reaped = 0.0
        self.alive: set[int] = set()  # at the last reading
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="server-cpu", daemon=True)

    def __enter__(self) -> ServerCpu:
        self.reaped = -self._read()
        self.first = {pid: own for pid, (_, own) in self.last.items()}
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join()
        self.reaped += self._read()

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            self._read()

    def _read(self) -> float:
        """Read every child's own seconds; the postmaster's reaped-children seconds."""
        tick = os.sysconf("SC_CLK_TCK")
        base = Path(f"/proc/{self.postmaster}")
        pids = (base / "task" / str(self.postmaster) / "children").read_text().split()
        reaped = 0.0
        alive = set()
        for pid in [self.postmaster, *map(int, pids)]:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            alive.add(pid)
            fields = stat[stat.rindex(")") + 2 :].split()
            kind = self.last[pid][0] if pid in self.last else self._kind(pid)
            self.last[pid] = (kind, (int(fields[11]) + int(fields[12])) / tick)
            if pid == self.postmaster:  # cutime and cstime: fields 16 and 17 of proc(5)
                reaped = (int(fields[13]) + int(fields[14])) / tick
        self.alive = alive
        return reaped

    def _kind(self, pid: int) -> str:
        if pid == self.postmaster:
            return "postmaster"
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return "backends"
        if "autovacuum" in title:
            return "autovacuum"
        if any(w in title for w in ("checkpointer", "background writer", "walwriter")):
            return "writers"
        return "backends"

    def by_kind(self) -> dict[str, float]:
        """The span's CPU seconds by kind."""
        spent = {"backends": 0.0, "autovacuum": 0.0, "writers": 0.0, "postmaster": 0.0}
        for pid, (kind, own) in self.last.items():
            spent[kind] += own - self.first.get(pid, 0.0)
        # The reaped time holds the whole lives of those that ended: what their last readings
        # did not see of them, and those never read.
        ended = sum(own for pid, (_, own) in self.last.items() if pid not in self.alive)
        spent["unseen"] = max(self.reaped - ended, 0.0)
        return spent


async def autovacuum_running(url: str) -> list[str]:
    """What autovacuum workers are doing now (their queries)."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT query FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
        )
    finally:
        await conn.close()
    return sorted(r["query"] for r in rows)


# --- the season ----------------------------------------------------------------------------


def season_shape(events: int) -> tuple[int, int]:
    """How many season tables hold about ``events`` events, and exactly how many they hold."""
    tables = max(1, round(events / MEAN_EVENTS))
    return tables, sum(events_of(n) for n in range(tables))


def events_of(n: int) -> int:
    """The events of season table ``n`` (60 to 200; the SQL computes the same)."""
    return 60 + (n * 7919) % 141


def hand_records(count: int, seed: int = 32) -> list[str]:
    """End-of-hand records as the service stores them, of hands two random-legal players play
    to their end on the engine."""
    rng = random.Random(seed)
    timing = Timing(now=time.time())
    encode = msgspec.json.Encoder().encode
    quits = (c.Resign, c.Leave)
    records: list[str] = []
    while len(records) < count:
        state, _ = new_game(TableOptions(), timing)
        deck = list(range(52))
        rng.shuffle(deck)
        state, _ = deal(state, deck, f"{rng.getrandbits(128):032x}", rng.randrange(2), timing)
        while state.hand is not None:
            seat = to_act(state)
            assert seat is not None
            moves = [m for m in legal(state, seat, timing) if type(m) not in quits]
            state, events = apply(state, seat, rng.choice(moves), timing)
            records += (encode(e).decode() for e in events if isinstance(e, HandEnded))
    return records[:count]


async def columns(conn: Conn, table: str) -> set[str]:
    """The columns of one of the service's tables, as information_schema has them."""
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = $1 AND table_name = $2",
        SCHEMA,
        table,
    )
    return {r["column_name"] for r in rows}


async def sizes(conn: Conn) -> dict[str, dict[str, int]]:
    """Each hot table's bytes (all its partitions; with indexes and TOAST, and its heap alone)
    and rows (live and dead, as the statistics count them)."""
    found: dict[str, dict[str, int]] = {}
    for table in HOT:
        row = await conn.fetchrow(
            "SELECT coalesce(sum(pg_total_relation_size(p.relid)), 0) AS total_bytes,"
            " coalesce(sum(pg_relation_size(p.relid)), 0) AS heap_bytes,"
            " coalesce(sum(s.n_live_tup), 0) AS live_rows,"
            " coalesce(sum(s.n_dead_tup), 0) AS dead_rows,"
            " count(*) FILTER (WHERE p.isleaf) AS partitions"
            " FROM (SELECT relid, isleaf FROM pg_partition_tree($1::regclass)"
            "  UNION SELECT $1::regclass, true WHERE NOT EXISTS"
            "  (SELECT FROM pg_partitioned_table WHERE partrelid = $1::regclass)) p"
            " LEFT JOIN pg_stat_user_tables s ON s.relid = p.relid",
            f"{SCHEMA}.{table}",
        )
        assert row is not None
        found[table] = {k: int(v) for k, v in row.items()}
    return found


async def fill_season(url: str, events: int, now: float) -> dict[str, Any]:
    """The season: finished tables whose last moves fall in the DAYS before ``now``, with
    about ``events`` events, their commands, hands and deadlines rows, copied from what the
    first round stored; what it took and the sizes after."""
    tables, expected = season_shape(events)
    conn = await asyncpg.connect(url, server_settings={"search_path": SCHEMA})
    try:
        events_columns = await columns(conn, "events")
        commands_columns = await columns(conn, "commands")
        ratio = await conn.fetchval(
            "SELECT (SELECT count(*) FROM commands)::float8 / greatest(count(*), 1) FROM events"
        )
        await _samples(conn, tables, now, hand_records(HAND_SAMPLES))
        partitions = await season_partitions(conn, now)
    finally:
        await conn.close()
    began = time.perf_counter()
    timed: dict[str, float] = {}
    at = "at" in events_columns
    answered_at = "answered_at" in commands_columns
    inserted = dict(
        zip(
            ("events", "commands"),
            await asyncio.gather(
                _filled(url, "events", events_sql(at), tables, timed),
                _filled(url, "commands", commands_sql(answered_at), tables, timed, ratio),
            ),
            strict=True,
        )
    )
    for name, sql in (("hands", _HANDS_SQL), ("tables", _TABLES_SQL)):
        inserted[name] = await _filled(url, name, sql, tables, timed)
    await _filled(url, "deadlines", _DEADLINES_SQL, tables, timed)
    fill_s = time.perf_counter() - began
    conn = await asyncpg.connect(url, server_settings={"search_path": SCHEMA})
    try:
        await conn.execute(
            "DROP TABLE public.season_tables, public.season_events,"
            " public.season_commands, public.season_hands, public.season_row"
        )
        after = await sizes(conn)
    finally:
        await conn.close()
    return {
        "tables": tables,
        "events": expected,
        "inserted": inserted,
        "commands_per_event": round(ratio, 3),
        "days": DAYS,
        "filled_at": "at" if at else None,
        "filled_answered_at": "answered_at" if answered_at else None,
        "partitions_made": partitions,
        "fill_s": round(fill_s, 1),
        "fill_s_by_table": {k: round(v, 1) for k, v in timed.items()},
        "sizes": after,
    }


async def _samples(conn: asyncpg.Connection, tables: int, now: float, hands: list[str]) -> None:
    """The fill's inputs, as tables of their own (each statement's connection reads them):
    the season's tables (number, id, events, commands, hands, first move's time), the first
    round's events and command answers numbered, the engine's hand records and one table row.
    Season ids start with ``s`` and have the service's shape (12 URL-safe characters)."""
    first = datetime.fromtimestamp(now, UTC) - timedelta(days=DAYS)
    span_s = DAYS * 86400 - MEAN_EVENTS * 2 * STEP_S  # the last one ends before now
    await conn.execute(
        """
        CREATE UNLOGGED TABLE public.season_events AS
        SELECT (row_number() OVER (ORDER BY table_id, seq) - 1)::int AS n, type, envelope
        FROM events;
        CREATE UNLOGGED TABLE public.season_commands AS
        SELECT (row_number() OVER (ORDER BY table_id, command_id) - 1)::int AS n,
            table_id, result
        FROM commands;
        CREATE UNLOGGED TABLE public.season_row AS
        SELECT options, state FROM tables WHERE state IS NOT NULL LIMIT 1;
        CREATE UNLOGGED TABLE public.season_hands (n int PRIMARY KEY, record jsonb);
        """
    )
    await conn.executemany(
        "INSERT INTO public.season_hands VALUES ($1, $2::jsonb)", list(enumerate(hands))
    )
    await conn.execute(
        f"""
        CREATE UNLOGGED TABLE public.season_tables AS
        SELECT n, 's' || substr(md5('season' || n), 1, 11) AS table_id,
            60 + (n * 7919) % 141 AS k,
            '{first.isoformat()}'::timestamptz
                + make_interval(secs => n * {span_s!r} / {tables}) AS started
        FROM generate_series(0, {tables} - 1) n;
        ALTER TABLE public.season_tables ADD PRIMARY KEY (n);
        """
    )


async def season_partitions(conn: asyncpg.Connection, now: float) -> list[str]:
    """The season's months as partitions of events, where events is partitioned: those the
    maintenance task (``maintenance.make_month``) would have made month after month."""
    partitioned = await conn.fetchval(
        "SELECT EXISTS (SELECT FROM pg_partitioned_table WHERE partrelid = 'events'::regclass)"
    )
    if not partitioned:
        return []
    first = datetime.fromtimestamp(now, UTC) - timedelta(days=DAYS)
    months = round(DAYS / 28) + 2
    return [
        maintenance.partition_name(month)
        for month in maintenance.months_from(first, months)
        if month.timestamp() <= now and await maintenance.make_month(conn, month)
    ]


def _chunks(tables: int) -> Iterator[tuple[int, int]]:
    size = -(-tables // CHUNKS)
    for lo in range(0, tables, size):
        yield lo, min(lo + size, tables)


async def _filled(
    url: str, name: str, sql: str, tables: int, timed: dict[str, float], *args: Any
) -> int:
    """One part of the fill, a statement per slice of the season's tables, on a connection
    of its own; its seconds in ``timed``; the rows it inserted."""
    began = time.perf_counter()
    rows = 0
    conn = await asyncpg.connect(url, server_settings={"search_path": SCHEMA})
    try:
        for lo, hi in _chunks(tables):
            status = await conn.execute(sql, lo, hi, *args)
            rows += int(status.rsplit(" ", 1)[1])  # INSERT 0 <rows>
            print(
                f"bench: season {name}: tables {hi}/{tables}, {time.perf_counter() - began:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await conn.close()
    timed[name] = time.perf_counter() - began
    return rows


def events_sql(at: bool) -> str:
    """The season's events, ``STEP_S`` apart at each table."""
    return f"""
INSERT INTO events (table_id, seq, type, envelope{", at" if at else ""})
SELECT t.table_id, i, s.type,
    s.envelope || jsonb_build_object('id', gen_random_uuid(), 'table_id', t.table_id,
        'seq', i, 'version', i,
        'occurred_at', to_char(w.ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
    {", w.ts" if at else ""}
FROM public.season_tables t
CROSS JOIN LATERAL generate_series(1, t.k) i
CROSS JOIN LATERAL (SELECT t.started + make_interval(secs => i * {STEP_S}) AS ts) w
JOIN public.season_events s
    ON s.n = (t.n * 131 + i) % (SELECT count(*) FROM public.season_events)
WHERE t.n >= $1 AND t.n < $2
"""


def commands_sql(answered_at: bool) -> str:
    """The season's commands, each answered at its share of its table's time."""
    when = f", t.started + make_interval(secs => j * t.k * {STEP_S} / w.c)"
    return f"""
INSERT INTO commands (table_id, command_id, actor, result{", answered_at" if answered_at else ""})
SELECT t.table_id, gen_random_uuid()::text,
    'person:s' || ((t.n * 2 + j % 2) % {PLAYERS}),
    replace(s.result, s.table_id, t.table_id)
    {when if answered_at else ""}
FROM public.season_tables t
CROSS JOIN LATERAL (SELECT greatest(1, round(t.k * $3::float8))::int AS c) w
CROSS JOIN LATERAL generate_series(1, w.c) j
JOIN public.season_commands s
    ON s.n = (t.n * 131 + j) % (SELECT count(*) FROM public.season_commands)
WHERE t.n >= $1 AND t.n < $2
"""


_HANDS_SQL = f"""
INSERT INTO hands (table_id, hand, record)
SELECT t.table_id, h, s.record || jsonb_build_object('hand', h)
FROM public.season_tables t
CROSS JOIN LATERAL generate_series(1, (t.k + {EVENTS_PER_HAND} - 1) / {EVENTS_PER_HAND}) h
JOIN public.season_hands s ON s.n = (t.n * 7 + h) % {HAND_SAMPLES}
WHERE t.n >= $1 AND t.n < $2
"""

_TABLES_SQL = f"""
INSERT INTO tables (table_id, invite_code, creator_id, options, seats, status, state,
    version, seq, created_at, last_move_at)
SELECT t.table_id, substr(md5('invite' || t.n), 1, 22), 's' || ((t.n * 2) % {PLAYERS}),
    r.options,
    jsonb_build_array(
        jsonb_build_object('id', 's' || ((t.n * 2) % {PLAYERS}), 'name', 'A'),
        jsonb_build_object('id', 's' || ((t.n * 2 + 1) % {PLAYERS}), 'name', 'B')),
    'closed', r.state, t.k, t.k, t.started,
    t.started + make_interval(secs => t.k * {STEP_S})
FROM public.season_tables t, public.season_row r
WHERE t.n >= $1 AND t.n < $2
"""

# A closed table's deadlines row: none running (what saving its last change wrote).
_DEADLINES_SQL = """
INSERT INTO deadlines (table_id)
SELECT table_id FROM public.season_tables WHERE n >= $1 AND n < $2
"""


# --- maintenance ---------------------------------------------------------------------------


async def maintenance_run(url: str, now: float) -> dict[str, Any]:
    """One run of the table's maintenance task (``Maintenance.run_once``: every step, the
    archive's too as the app adds it, to a directory of this run's unless BENCH_SEASON_ARCHIVE
    is 0) on the season, the app's clock at ``now``, answers kept RETENTION_S: what each step
    did, its seconds, the run after it, and the hot tables' sizes before and after."""
    store = ROOT / ".run" / "bench" / f"season-archive-{os.getpid()}"
    settings = Settings.from_env(
        command_retention_s=RETENTION_S, archive_url=f"file://{store}" if ARCHIVE else ""
    )
    pool = await asyncpg.create_pool(
        url, min_size=1, max_size=2 + archive.WRITERS, server_settings={"search_path": SCHEMA}
    )
    assert pool is not None
    try:
        async with pool.acquire() as conn:
            before = await sizes(conn)
        task = maintenance.Maintenance(pool, settings, CollectorRegistry(), lambda: now, SCHEMA)
        step = archive.archive_step(pool, settings)
        if step is not None:
            task.steps.append(("archive", step))
        began = time.perf_counter()
        done = await task.run_once()
        seconds = time.perf_counter() - began
        # The run after it, GIN_MAINTENANCE_EVERY_S later by the app's clock: what a run
        # costs once the backlog is gone.
        task.clock = lambda: now + settings.maintenance_every_s
        began = time.perf_counter()
        next_done = await task.run_once()
        next_seconds = time.perf_counter() - began
        archived = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    finally:
        await pool.close()
        shutil.rmtree(store, ignore_errors=True)
    # A backend's row counts reach the statistics when it ends, or within a second or so.
    await asyncio.sleep(2)
    reader = await asyncpg.connect(url)
    try:
        after = await sizes(reader)
    finally:
        await reader.close()
    return {
        "retention_s": RETENTION_S,
        "batch": settings.maintenance_batch,
        "done": done,
        "seconds": round(seconds, 2),
        "every_s": settings.maintenance_every_s,
        "next_done": next_done,
        "next_seconds": round(next_seconds, 2),
        "archive": "file" if ARCHIVE else None,
        "archived_bytes": archived,
        "sizes_before": before,
        "sizes_after": after,
    }


# --- the summary ---------------------------------------------------------------------------


def goals(
    without: list[dict[str, Any]],
    with_: list[dict[str, Any]],
    fill: dict[str, Any],
    maintained: dict[str, Any],
) -> dict[str, Any]:
    """The season's figures side by side: the p99 of every round's samples pooled, the
    median answer p99 and the mean CPU per move of the move path with the season over without
    it; autovacuum's apart; the maintenance runs; the hot tables before and after them."""

    def server(r: dict[str, Any], *kinds: str) -> float:
        """This run's PostgreSQL, ms a move of some kinds: its ms a second over the round
        over the round's moves a second (set-up and drain included: an estimate)."""
        per_s = r["this_postgresql_cpu_ms_per_s"]
        return float(sum(per_s.get(k, 0.0) for k in kinds) / r["per_s"])

    def cpu(rounds: list[dict[str, Any]]) -> float:
        """The move path's: the service, its relay and this run's PostgreSQL but autovacuum
        (table_load's ``postgresql`` part counts every server of the machine)."""
        return round(
            statistics.fmean(
                r["cpu_ms_per_move"]["service"]
                + r["cpu_ms_per_move"].get("relay", 0.0)
                + server(r, "backends", "writers", "postmaster")
                for r in rounds
            ),
            3,
        )

    def autovacuum(rounds: list[dict[str, Any]]) -> float:
        return round(statistics.fmean(server(r, "autovacuum", "unseen") for r in rounds), 3)

    def machine(rounds: list[dict[str, Any]]) -> float:
        return round(statistics.fmean(r["machine_cpu_ms_per_move"] for r in rounds), 3)

    def pooled(rounds: list[dict[str, Any]]) -> float:
        return p99([x for r in rounds for x in r["_latencies_ms"]])

    def answer(rounds: list[dict[str, Any]]) -> float:
        return round(float(statistics.median(r["command_to_answer_p99_ms"] for r in rounds)), 2)

    def ratio(a: float, b: float) -> float | None:
        return round(b / a, 3) if a else None

    before = maintained["sizes_before"]
    after = maintained["sizes_after"]
    return {
        "events": fill["events"],
        "fill_s": fill["fill_s"],
        "rounds": len(without),
        "pooled_p99_ms_without": pooled(without),
        "pooled_p99_ms_with": pooled(with_),
        "p99_ratio": ratio(pooled(without), pooled(with_)),
        "answer_p99_median_ms_without": answer(without),
        "answer_p99_median_ms_with": answer(with_),
        "answer_p99_ratio": ratio(answer(without), answer(with_)),
        "cpu_ms_per_move_without": cpu(without),
        "cpu_ms_per_move_with": cpu(with_),
        "cpu_ratio": ratio(cpu(without), cpu(with_)),
        # Autovacuum's (its first pass over the tables the fill grew, in the "with" rounds)
        # and what ended unseen, per move of the round.
        "autovacuum_cpu_ms_per_move_without": autovacuum(without),
        "autovacuum_cpu_ms_per_move_with": autovacuum(with_),
        "machine_cpu_ms_per_move_without": machine(without),
        "machine_cpu_ms_per_move_with": machine(with_),
        "machine_cpu_ratio": ratio(machine(without), machine(with_)),
        "maintenance_s_first_run": maintained["seconds"],
        "maintenance_done_first_run": maintained["done"],
        "maintenance_s_next_run": maintained["next_seconds"],
        "maintenance_done_next_run": maintained["next_done"],
        "commands_live_rows_before": before["commands"]["live_rows"],
        "commands_live_rows_after": after["commands"]["live_rows"],
        "commands_heap_bytes_before": before["commands"]["heap_bytes"],
        "commands_heap_bytes_after": after["commands"]["heap_bytes"],
        # The room the rows kept take, at the season's bytes a row: the rest of the heap is
        # room for new answers once vacuum has been through; it stays the table's (only
        # VACUUM FULL gives it back to the file system).
        "commands_kept_rows_heap_bytes": round(
            after["commands"]["live_rows"]
            * before["commands"]["heap_bytes"]
            / max(before["commands"]["live_rows"], 1)
        ),
        "events_total_bytes": after["events"]["total_bytes"],
        "hands_total_bytes": after["hands"]["total_bytes"],
    }


if __name__ == "__main__":
    main()
