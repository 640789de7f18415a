"""The routes every service answers: /healthz, /readyz and Prometheus /metrics; and what
every service measures: its process (CPU, memory, file descriptors, garbage collections) and
each HTTP route's latency and status (5xx included)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.registry import Collector

from shared.infra.files import FileBudget, soft_limit

Check = Callable[[], Awaitable[object]]
REGISTRY = web.AppKey("registry", CollectorRegistry)
CHECK_TIMEOUT_S = 2.0


def add_ops_routes(app: web.Application, checks: Mapping[str, Check]) -> None:
    """Add the three routes; ``/readyz`` is 200 only when every check passes in time."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        results: dict[str, str] = {}
        for name, check in checks.items():
            try:
                await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
                results[name] = "ok"
            except Exception as exc:  # a readiness probe reports, it never raises
                results[name] = f"failing: {exc!r}"
        ready = all(v == "ok" for v in results.values())
        return web.json_response(
            {"status": "ready" if ready else "not_ready", "checks": results},
            status=200 if ready else 503,
        )

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(request.app[REGISTRY])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    instrument(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


def count_buckets(bound: int) -> tuple[float, ...]:
    """Buckets for a count that never passes ``bound`` (a queue's depth, a batch's size):
    powers of two below it, and the bound itself.

    >>> count_buckets(10)
    (1.0, 2.0, 4.0, 8.0, 10.0)
    """
    edges = {float(1 << n) for n in range(bound.bit_length()) if 1 << n < bound}
    return tuple(sorted(edges | {float(max(bound, 1))}))


class ProcessMetrics(Collector):
    """prometheus-client's process metrics under the same names (CPU, memory, start time,
    open and maximum files), but ``process_open_fds`` counted as the size of
    ``/proc/self/fd`` where the kernel gives it (Linux 6.2 on: the same cost however many are
    open), not by listing that directory at every scrape as ProcessCollector does, which
    holds the event loop in proportion to the sockets open. ``process_max_fds`` is the soft
    limit as the process has it (raised at start: shared/infra/files.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page = resource.getpagesize()
        with open("/proc/stat", "rb") as stat:
            self._boot = next(float(ln.split()[1]) for ln in stat if ln.startswith(b"btime "))
        self._files = FileBudget(soft_limit(), 0)
        registry.register(self)

    def collect(self) -> list[Metric]:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[-1].split()
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        return [
            gauge(
                "process_virtual_memory_bytes", "Virtual memory size in bytes.", float(fields[20])
            ),
            gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                float(fields[21]) * self._page,
            ),
            gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                float(fields[19]) / self._ticks + self._boot,
            ),
            counter(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                (float(fields[11]) + float(fields[12])) / self._ticks,
            ),
            gauge("process_open_fds", "Number of open file descriptors.", self._files.open_files()),
            gauge("process_max_fds", "Maximum number of open file descriptors.", soft_limit()),
        ]


# A client may send any method token: the others share one label, so none adds series.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def instrument(app: web.Application) -> None:
    """The process collectors on the app's registry, and the per-route middleware, outermost
    (it sees every answer as sent, a refusal's or aiohttp's own)."""
    registry = app[REGISTRY]
    ProcessMetrics(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    app.middlewares.insert(0, route_metrics(registry))
    gc_pauses(app)
    app.cleanup_ctx.append(loop_lag)


LAG_TICK_S = 0.05  # how often the loop's lag is sampled


async def loop_lag(app: web.Application) -> AsyncIterator[None]:
    """How late the event loop runs a timer: every request, socket and message of the
    process waits that long behind whatever holds the loop (a collection, a long pass)."""
    lag = Histogram(
        "gin_event_loop_lag_seconds",
        f"How late a {LAG_TICK_S} s timer of the event loop ran",
        registry=app[REGISTRY],
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
    )

    async def sample() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            lag.observe(max(0.0, loop.time() - due))

    task = asyncio.create_task(sample(), name="loop-lag")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def gc_pauses(app: web.Application) -> None:
    """Time every pause of the garbage collector, by generation: a full collection stops
    every command and socket of the process (the stalls of a paced round's tail). The hook
    is the process's; the app takes its own away at cleanup."""
    pauses = Histogram(
        "gin_gc_pause_seconds",
        "Time the garbage collector paused the process, by generation",
        ["generation"],
        registry=app[REGISTRY],
        buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    )
    by_generation = [pauses.labels(str(n)) for n in range(3)]
    started = 0.0

    def on_collection(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            by_generation[info["generation"]].observe(time.perf_counter() - started)

    async def unhook(_: web.Application) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(on_collection)

    gc.callbacks.append(on_collection)
    app.on_cleanup.append(unhook)


def route_metrics(registry: CollectorRegistry) -> Middleware:
    """A middleware counting each request by method, route (its pattern, never the path) and
    status, and timing it; an exception that becomes aiohttp's 500 is counted as 500."""
    seconds = Histogram(
        "gin_http_request_seconds",
        "Time to answer an HTTP request, by method and route (a WebSocket: its whole life)",
        ["method", "route"],
        registry=registry,
        buckets=LATENCY_BUCKETS,
    )
    answers = Counter(
        "gin_http_responses",
        "HTTP answers by method, route and status (5xx: the service failed the request)",
        ["method", "route", "status"],
        registry=registry,
    )

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = 499  # the client went away first
            raise
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            method = request.method if request.method in METHODS else "other"
            key = (method, route)
            timer = timers.get(key)
            if timer is None:
                timer = timers[key] = seconds.labels(*key)
            timer.observe(time.perf_counter() - started)
            counter = counters.get((*key, status))
            if counter is None:
                counter = counters[(*key, status)] = answers.labels(*key, str(status))
            counter.inc()

    # The labelled children, kept: prometheus_client's labels() costs as much as the update.
    # Bounded: seven methods, the app's own routes ("unmatched" for the rest), few statuses.
    timers: dict[tuple[str, str], Histogram] = {}
    counters: dict[tuple[str, str, int], Counter] = {}
    return middleware
