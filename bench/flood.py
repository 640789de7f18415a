"""``python -m bench.flood BASE TABLE_ID SECONDS RATE [CONNECTIONS]``: a non-seated identity
floods one table with commands from its own process (so its load lands on the service, not on
the players' client), then prints what it was answered as one JSON line.

Its connections are open before it floods (it prints one ``{"ready": N}`` line first, and
the round is measured from then on). The flood is open-loop, as an attacker's is: a command
is due every 1/RATE s whether or not the earlier ones were answered, and goes out on any of
CONNECTIONS keep-alive connections that is free (each carries one request at a time, as
HTTP/1.1 does). A command due while every connection waits for an answer is not sent:
``unsent`` counts them, so ``per_s`` is what the service let through, ``offered_per_s`` what
was asked.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections import Counter

import uvloop

from bench.table_load import SECRET, Line
from shared.infra.auth import mint

CONNECTIONS = 8


async def flood(
    base: str, table_id: str, seconds: float, rate: float, connections: int = CONNECTIONS
) -> dict[str, object]:
    """Offer ``rate`` commands a second for ``seconds``; the count of each status."""
    token = mint(SECRET, "flooder", "Flooder", ttl_s=3600)
    path = f"/v1/tables/{table_id}/commands"
    body = b'{"type":"draw","source":"stock"}'
    statuses: Counter[int] = Counter()
    free = [Line(base, token) for _ in range(connections)]
    for i in range(0, connections, 100):  # connected before the round: its start is no flood
        await asyncio.gather(*(line.connect() for line in free[i : i + 100]))
    print(json.dumps({"ready": connections}), flush=True)  # the round's measure starts now
    sending: set[asyncio.Task[None]] = set()
    unsent = 0

    async def send(line: Line) -> None:
        try:
            status, _ = await line.post(path, body)
            statuses[status] += 1
        except (OSError, asyncio.IncompleteReadError):
            statuses[0] += 1  # the connection failed; the next send reconnects
            line.close()
            line.reader = line.writer = None
        free.append(line)

    began = time.perf_counter()
    due = began
    while due < began + seconds:
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        if free:
            task = asyncio.create_task(send(free.pop()))
            sending.add(task)
            task.add_done_callback(sending.discard)
        else:
            unsent += 1
        due += 1.0 / rate
    elapsed = time.perf_counter() - began
    if sending:  # the answers still held count too, but not past the round's end
        await asyncio.wait(sending, timeout=10)
    for task in sending:
        task.cancel()
    for line in free:
        line.close()
    sent = sum(statuses.values())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "connections": connections,
        "offered_per_s": rate,
        "sent": sent,
        "per_s": round(sent / elapsed, 1),
        "unsent": unsent,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        # Its own CPU (start-up included): on this machine it is taken from the service's
        # cores, where in production an attacker's is not.
        "flooder_cpu_ms_per_s": round((usage.ru_utime + usage.ru_stime) * 1000 / elapsed, 1),
    }


def main() -> None:
    base, table_id, seconds, rate = sys.argv[1:5]
    connections = int(sys.argv[5]) if len(sys.argv) > 5 else CONNECTIONS
    figures = uvloop.run(flood(base, table_id, float(seconds), float(rate), connections))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
