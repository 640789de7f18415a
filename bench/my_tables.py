"""The caller's tables among many (issue 33): ``GET /v1/players/me/tables`` over HTTP with
BENCH_LIST_TABLES (100,000) tables in the database, the service running.

On one run's own database (``table_load.table_service``): the tables are generated in SQL, a
few statements, each with its ``deadlines`` row: BENCH_LIST_PLAYERS (5,000) players sit at
them, two to a table, so each has some 40; one heavy player sits at BENCH_LIST_HEAVY (2,000)
more, half as creator and half as joiner. Most play (a decision running for some seat since
a moment of the last 48 hours), some wait, some are over, some closed or expired; the
playing ones carry a real match's engine state (copied from a table played through the
API), so the page's scores are decoded from real bytes. Then ANALYZE (autovacuum's, made
now), the plan of the heavy player's list (which indexes it reads), and BENCH_LIST_REQUESTS
requests of each kind, one at a time: an ordinary player's first page, the heavy player's
first page, and a deep page of the heavy player (the page after BENCH_LIST_DEEP entries).
Each kind's p50, p99 and max in ms, as JSON lines.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

import aiohttp
import asyncpg

from bench.table_load import SECRET, emit, p99, table_service
from services.table import listing
from shared.infra.auth import mint

TABLES = int(os.environ.get("BENCH_LIST_TABLES", "100000"))
PLAYERS = int(os.environ.get("BENCH_LIST_PLAYERS", "5000"))
HEAVY = int(os.environ.get("BENCH_LIST_HEAVY", "2000"))
REQUESTS = int(os.environ.get("BENCH_LIST_REQUESTS", "300"))
DEEP = int(os.environ.get("BENCH_LIST_DEEP", "1000"))  # entries before the deep page
PAGE = 20
HEAVY_ID = "bench-heavy"

# Every table of the season in one statement: table n's creator and joiner are players n and
# n * 7 + 1 (mod PLAYERS, never the same), the heavy player takes seat 0 of every other
# HEAVY-th and seat 1 of the rest; the status by n (70% playing, 10% waiting, 10% over, 10%
# closed or expired); a decision since a moment of the last two days.
_FILL = """
INSERT INTO tables (table_id, invite_code, creator_id, options, seats, status, state,
    version, seq, created_at, last_move_at)
SELECT 'b' || n, 'code' || n, c.id, $3::jsonb,
    CASE WHEN s.status = 'waiting' THEN jsonb_build_array(
            jsonb_build_object('id', c.id, 'name', 'Jogador ' || c.id), NULL)
        ELSE jsonb_build_array(jsonb_build_object('id', c.id, 'name', 'Jogador ' || c.id),
            jsonb_build_object('id', j.id, 'name', 'Jogador ' || j.id)) END,
    s.status, CASE WHEN s.status = 'waiting' THEN NULL ELSE $4::bytea END,
    10, 40, $5::timestamptz - interval '3 days', $5::timestamptz - (n % 172800) * interval '1 s'
FROM generate_series(1, $1) AS n,
    LATERAL (SELECT CASE WHEN n % $2 = 0 AND n % (2 * $2) = 0 THEN $6
        ELSE 'p' || (n % $7) END AS id) c,
    LATERAL (SELECT CASE WHEN n % $2 = 0 AND n % (2 * $2) <> 0 THEN $6
        ELSE 'p' || ((n * 7 + 1 + CASE WHEN (n * 7 + 1) % $7 = n % $7 THEN 1 ELSE 0 END) % $7)
        END AS id) j,
    LATERAL (SELECT CASE WHEN n % 10 < 7 THEN 'playing' WHEN n % 10 = 7 THEN 'waiting'
        WHEN n % 10 = 8 THEN 'match_over' WHEN n % 20 = 9 THEN 'closed' ELSE 'expired' END
        AS status) s
"""
_DEADLINES = """
INSERT INTO deadlines (table_id, absence_seat, absence_since, absence_seq, expiry_since,
    expiry_seq)
SELECT table_id,
    CASE WHEN status = 'playing' THEN (hashtext(table_id) & 1)::smallint END,
    CASE WHEN status = 'playing' THEN last_move_at END,
    CASE WHEN status = 'playing' THEN 40 END,
    CASE WHEN status IN ('waiting', 'playing', 'match_over') THEN last_move_at END,
    CASE WHEN status IN ('waiting', 'playing', 'match_over') THEN 40 END
FROM tables WHERE table_id LIKE 'b%'
ON CONFLICT (table_id) DO NOTHING
"""


def main() -> None:
    """Fill, plan, measure; the figures as JSON lines."""
    began = time.perf_counter()
    with table_service(GIN_RATE_LISTS="100000000", GIN_RATE_COMMANDS="100000000") as service:
        asyncio.run(run(service.base, service.url, began))


async def run(base: str, url: str, began: float) -> None:
    """The whole group against one running service."""
    async with aiohttp.ClientSession() as session:
        played = await played_table(session, base)
    conn = await asyncpg.connect(url, server_settings={"search_path": "gin_table"})
    try:
        emit(bench="my_tables_fill", **await fill(conn, played))
        emit(bench="my_tables_plan", **await plan(conn))
    finally:
        await conn.close()
    async with aiohttp.ClientSession() as session:
        heavy = mint(SECRET, HEAVY_ID, "Pesado")
        ordinary = [mint(SECRET, f"p{n}", f"Jogador {n}") for n in range(1, 101)]
        deep_cursor = await cursor_after(session, base, heavy, DEEP)
        kinds = {
            "ordinary_first_page": [(t, None) for t in ordinary],
            "heavy_first_page": [(heavy, None)],
            "heavy_deep_page": [(heavy, deep_cursor)],
        }
        figures: dict[str, Any] = {}
        for kind, asks in kinds.items():
            samples = await timed(session, base, asks, REQUESTS)
            figures[kind] = summary(samples)
            emit(bench="my_tables_list", kind=kind, **figures[kind])
    emit(
        bench="my_tables_goals",
        tables=TABLES,
        heavy_tables=HEAVY,
        group_s=round(time.perf_counter() - began),
        **{f"{k}_p99_ms": v["p99_ms"] for k, v in figures.items()},
    )


async def played_table(session: aiohttp.ClientSession, base: str) -> str:
    """A real table with a match begun through the API (its state and options copied)."""
    ana, bia = mint(SECRET, "bench-ana", "Ana"), mint(SECRET, "bench-bia", "Bia")
    async with session.post(
        f"{base}/v1/tables", json={}, headers={"Authorization": f"Bearer {ana}"}
    ) as r:
        created = await r.json()
    async with session.post(
        f"{base}/v1/tables/{created['table_id']}/join",
        json={"invite_code": created["invite_code"]},
        headers={"Authorization": f"Bearer {bia}"},
    ) as r:
        assert r.status == 200, await r.text()
    return str(created["table_id"])


async def fill(conn: asyncpg.Connection, table_id: str) -> dict[str, Any]:
    """The tables and their deadlines, generated in SQL; ANALYZE after."""
    began = time.perf_counter()
    row = await conn.fetchrow(
        "SELECT state, options::text AS options FROM tables WHERE table_id = $1", table_id
    )
    assert row is not None
    await conn.execute(
        _FILL,
        TABLES,
        max(1, TABLES // HEAVY),
        row["options"],
        row["state"],
        await conn.fetchval("SELECT now()"),
        HEAVY_ID,
        PLAYERS,
    )
    await conn.execute(_DEADLINES)
    await conn.execute("ANALYZE tables; ANALYZE deadlines")
    heavy = await conn.fetchval(
        "SELECT count(*) FROM tables WHERE creator_id = $1 OR (seats #>> '{1,id}') = $1",
        HEAVY_ID,
    )
    ordinary = await conn.fetchval(
        "SELECT count(*) FROM tables WHERE creator_id = 'p1' OR (seats #>> '{1,id}') = 'p1'"
    )
    return {
        "tables": await conn.fetchval("SELECT count(*) FROM tables"),
        "heavy_player_tables": heavy,
        "player_p1_tables": ordinary,
        "seconds": round(time.perf_counter() - began, 1),
    }


async def plan(conn: asyncpg.Connection) -> dict[str, Any]:
    """The heavy player's first page, explained: the indexes it reads, any scan of a table
    whole, and its time as PostgreSQL measured it."""
    now = await conn.fetchval("SELECT now()")
    rows = await conn.fetch(
        "EXPLAIN (ANALYZE, BUFFERS) " + listing._MINE,
        HEAVY_ID,
        list(listing.STATUSES["open"]),
        now,
        -1,
        0,
        now,
        "",
        PAGE + 1,
    )
    text = "\n".join(r[0] for r in rows)
    print(text, file=sys.stderr, flush=True)  # the whole plan beside the bench's notes
    indexes = sorted(
        {w for w in text.replace("(", " ").split() if w.startswith(("tables_", "deadlines_"))}
    )
    return {
        "indexes": indexes,
        "seq_scans": [line.strip() for line in text.splitlines() if "Seq Scan" in line],
        "execution_ms": next(
            (float(line.split()[2]) for line in text.splitlines() if "Execution Time" in line),
            None,
        ),
    }


async def cursor_after(session: aiohttp.ClientSession, base: str, token: str, entries: int) -> str:
    """The cursor of the page after the first ``entries`` of the heavy player's list."""
    after: str | None = None
    for _ in range(entries // 100):
        page = await get_page(session, base, token, after, 100)
        after = page["next"]
        assert after is not None, "the heavy player has fewer tables than the deep page"
    assert after is not None
    return after


async def get_page(
    session: aiohttp.ClientSession, base: str, token: str, after: str | None, limit: int = PAGE
) -> dict[str, Any]:
    """One page of the list."""
    query = f"?limit={limit}" + (f"&after={after}" if after else "")
    async with session.get(
        f"{base}/v1/players/me/tables{query}", headers={"Authorization": f"Bearer {token}"}
    ) as r:
        assert r.status == 200, await r.text()
        return await r.json()  # type: ignore[no-any-return]


async def timed(
    session: aiohttp.ClientSession,
    base: str,
    asks: list[tuple[str, str | None]],
    requests: int,
) -> list[float]:
    """Each request's time (ms), one at a time, the asks taken in turn."""
    samples = []
    for n in range(requests):
        token, after = asks[n % len(asks)]
        start = time.perf_counter()
        await get_page(session, base, token, after)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p99 and max of some latencies (ms), rounded."""
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": p99(ordered),
        "max_ms": round(ordered[-1], 2),
    }
