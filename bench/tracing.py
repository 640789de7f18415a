"""The cost of tracing (issue 34, part 4): the move path off, sampling 1%, sampling 100%.

The whole backend as production runs it (bench/backend.py's throwaway PostgreSQL and
RabbitMQ, each service a process of its own: the table with its relay apart, the timers,
the chat, the bots), started anew for each mode with that mode's environment:

- ``off``: ``OTEL_TRACES_EXPORTER=none``, the default (no provider installed);
- ``sampled_1pct`` and ``sampled_100pct``: ``otlp`` with ``parentbased_traceidratio`` at
  0.01 and 1.0, exported over OTLP/HTTP to a sink of this bench's own, a process that reads
  and counts every span it is sent and keeps none (``sink``): the export's cost is paid, its
  destination's is not the backend's.

The modes take turns, round after round (BENCH_ROUNDS), so that a drift of the machine falls
on each alike. Each round plays BENCH_TRACING_MATCHES matches of two random-legal players
(``table_load.Match``), each seat thinking BENCH_TRACING_THINK_S on average before a move
(paced: below the machine's saturation, so latency is the move's own, not a queue's), for
BENCH_SECONDS; then waits BENCH_TRACING_SETTLE_S for what the moves left queued (the relay's
publishes, the chat's events, the batch exporter's spans: every
``OTEL_BSP_SCHEDULE_DELAY``) before the CPU is read. Figures per round: moves a second, the
move's latency (a command to its answer) p50 and p99, the CPU ms per move of each part and of
the backend, and the spans exported per move. A last line, ``tracing_cost``, gives each
mode's medians over the rounds and their ratios to ``off``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import uvloop

from bench.backend import (
    DATABASE,
    Backend,
    PartsCpu,
    declare_topology,
    every_service,
    service_env,
    stop,
    throwaway_servers,
)
from bench.backend import servers as server_scripts
from bench.table_load import (
    ROOT,
    ROUNDS,
    SECONDS,
    Match,
    database,
    emit,
    free_port,
)

MATCHES = int(os.environ.get("BENCH_TRACING_MATCHES", "40"))
THINK_S = float(os.environ.get("BENCH_TRACING_THINK_S", "0.1"))
SETTLE_S = float(os.environ.get("BENCH_TRACING_SETTLE_S", "6"))
MODES: dict[str, dict[str, str]] = {
    "off": {"OTEL_TRACES_EXPORTER": "none"},
    "sampled_1pct": {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    },
    "sampled_100pct": {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    },
}

# The OTLP/HTTP sink: every export request read whole, its spans counted (the protobuf
# parsed), nothing kept; GET /count says how many so far.
SINK = """
import sys
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)
counts = {"requests": 0, "spans": 0, "bytes": 0}
empty = ExportTraceServiceResponse().SerializeToString()
async def traces(request):
    body = await request.read()
    sent = ExportTraceServiceRequest.FromString(body)
    counts["requests"] += 1
    counts["bytes"] += len(body)
    counts["spans"] += sum(
        len(scope.spans) for resource in sent.resource_spans for scope in resource.scope_spans
    )
    return web.Response(body=empty, content_type="application/x-protobuf")
async def count(request):
    return web.json_response(counts)
app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_post("/v1/traces", traces)
app.router.add_get("/count", count)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


@contextlib.contextmanager
def sink() -> Iterator[str]:
    """The span sink as a process of its own; its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SINK, str(port)], cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(_until_up(base, proc))
        yield base
    finally:
        stop(proc)


async def _until_up(base: str, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError("the span sink exited")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{base}/count") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError("the span sink did not start")


async def exported(base: str) -> int:
    """Spans the sink has been sent so far."""
    async with aiohttp.ClientSession() as session, session.get(f"{base}/count") as r:
        return int((await r.json())["spans"])


@contextlib.contextmanager
def services(backend: Backend, mode: dict[str, str]) -> Iterator[Backend]:
    """Every service, started with the mode's environment, stopped (its spans flushed) after."""
    run = Backend(
        urls=backend.urls,
        ctl=backend.ctl,
        ctl_env=backend.ctl_env,
        env={**backend.env, **mode, "GIN_HTTP_PORT": str(free_port())},
        roots=backend.roots,
    )
    with every_service(run, "tracing-table"):
        yield run


@contextlib.contextmanager
def backend_servers() -> Iterator[tuple[Backend, str]]:
    """The throwaway servers, the database and topology, and the span sink."""
    with throwaway_servers() as (pg, rabbit, state_dir), sink() as collector:
        asyncio.run(database(pg.url, DATABASE, True))
        urls = {
            "GIN_DATABASE_URL": pg.url.rpartition("/")[0] + "/" + DATABASE,
            "GIN_AMQP_URL": rabbit.url,
        }
        asyncio.run(declare_topology(rabbit.url))
        env = {k: v for k, v in service_env(urls).items() if not k.startswith("OTEL_")}
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector
        base = Backend(
            urls=urls,
            ctl=[str(server_scripts.RABBIT_BIN_DIR / "rabbitmqctl"), "-n", rabbit.nodename],
            ctl_env=server_scripts.rabbit_env(rabbit, server_scripts.owner_of(state_dir)),
            env=env,
            roots={
                "postgres": [pg.pid or 0],
                "rabbitmq": [p for p in (rabbit.script_pid, rabbit.epmd_pid) if p],
            },
        )
        yield base, collector


def quantile(samples: list[float], q: float) -> float | None:
    """The ``q`` quantile of latencies in seconds, as ms."""
    if not samples:
        return None
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)


async def paced_round(run: Backend, collector: str) -> dict[str, Any]:
    """The paced matches for SECONDS, then SETTLE_S; the round's figures."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        matches = [Match(run.table, session, n, think_s=THINK_S) for n in range(MATCHES)]
        for i in range(0, len(matches), 20):
            await asyncio.gather(*(m.setup() for m in matches[i : i + 20]))
        ready = asyncio.Barrier(2 * len(matches) + 1)
        gc.collect()
        gc.freeze()
        seats = [asyncio.ensure_future(m.seat(s, ready)) for m in matches for s in (0, 1)]
        await asyncio.wait_for(ready.wait(), 120)
        spans_before = await exported(collector)
        cpu = PartsCpu(run.parts())
        moved = sum(m.moves for m in matches)
        began = time.perf_counter()
        await asyncio.sleep(SECONDS)
        ended = time.perf_counter()
        for m in matches:
            m.over = True
        moves = sum(m.moves for m in matches) - moved
        await asyncio.sleep(SETTLE_S)
        spent = cpu.ms_per_move(moves)
        spans = await exported(collector) - spans_before
        await asyncio.gather(*(m.stop() for m in matches))
        await asyncio.wait_for(asyncio.gather(*seats, return_exceptions=True), 30)
        for m in matches:
            m.close()
    answers = [
        a
        for m in matches
        for a, at in zip(m.answers, m.answered_at, strict=True)
        if began <= at < ended
    ]
    per_part = spent["cpu_ms_per_move"]
    return {
        "moves": moves,
        "per_s": round(moves / (ended - began), 1),
        "refused": sum(m.errors for m in matches),
        "move_p50_ms": quantile(answers, 0.5),
        "move_p99_ms": quantile(answers, 0.99),
        "backend_cpu_ms_per_move": spent["backend_total_cpu_ms_per_move"],
        "table_cpu_ms_per_move": per_part.get("table"),
        "cpu_ms_per_move": per_part,
        "spans_exported_per_move": round(spans / max(moves, 1), 2),
    }


def summary(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each mode's medians over the rounds, and their ratios to ``off``'s."""
    keys = (
        "per_s",
        "move_p50_ms",
        "move_p99_ms",
        "backend_cpu_ms_per_move",
        "table_cpu_ms_per_move",
        "spans_exported_per_move",
    )
    medians = {
        mode: {
            k: round(statistics.median(r[k] for r in of if r[k] is not None), 3)
            for k in keys
            if any(r[k] is not None for r in of)
        }
        for mode, of in rounds.items()
    }
    off = medians["off"]
    ratios = {
        mode: {
            k: round(v / off[k], 3)
            for k, v in figures.items()
            if k in off and off[k] and k != "spans_exported_per_move"
        }
        for mode, figures in medians.items()
        if mode != "off"
    }
    return {"medians": medians, "over_off": ratios}


def main() -> None:
    """Start the servers and the sink; the modes in turn, round after round; the summary."""
    began = time.perf_counter()
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with backend_servers() as (base, collector):
        for n in range(ROUNDS):
            for mode, env in MODES.items():
                with services(base, env) as run:
                    figures = uvloop.run(paced_round(run, collector))
                rounds[mode].append(figures)
                emit(bench="tracing_round", mode=mode, round=n, **figures)
    emit(
        bench="tracing_cost",
        rounds=ROUNDS,
        matches=MATCHES,
        think_s=THINK_S,
        seconds=SECONDS,
        wall_s=round(time.perf_counter() - began, 1),
        **summary(rounds),
    )


if __name__ == "__main__":
    main()
