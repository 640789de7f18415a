"""``python -m bench.flood BASE TABLE_ID SECONDS RATE``: a non-seated identity floods one table
with commands, RATE per second for SECONDS, from its own process (so its load lands on the
service, not on the players' client), then prints what it was answered as one JSON line."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter

import uvloop

from bench.table_load import SECRET, Line
from shared.infra.auth import mint

CONNECTIONS = 8  # keep-alive connections, each sending its share on a fixed schedule


async def flood(base: str, table_id: str, seconds: float, rate: float) -> dict[str, object]:
    """Send ``rate`` commands a second for ``seconds``; the count of each status."""
    token = mint(SECRET, "flooder", "Flooder", ttl_s=3600)
    path = f"/v1/tables/{table_id}/commands"
    body = b'{"type":"draw","source":"stock"}'
    statuses: Counter[int] = Counter()
    late = 0
    began = time.perf_counter()

    async def line(k: int) -> None:
        nonlocal late
        conn = Line(base, token)
        interval = CONNECTIONS / rate
        due = began + k * interval / CONNECTIONS
        try:
            while due < began + seconds:
                now = time.perf_counter()
                if due > now:
                    await asyncio.sleep(due - now)
                elif now - due > interval:
                    late += 1  # the service answered too slowly to keep the pace
                status, _ = await conn.post(path, body)
                statuses[status] += 1
                due += interval
        finally:
            conn.close()

    await asyncio.gather(*(line(k) for k in range(CONNECTIONS)))
    elapsed = time.perf_counter() - began
    sent = sum(statuses.values())
    return {
        "sent": sent,
        "per_s": round(sent / elapsed, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "late": late,
    }


def main() -> None:
    base, table_id, seconds, rate = sys.argv[1:5]
    figures = uvloop.run(flood(base, table_id, float(seconds), float(rate)))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
