"""What every service measures (issue 14, part 4): its process, each route's latency and
status (a 5xx included, an unknown path under one label), and how long a database connection
was waited for and how many it holds; the readiness probe has a connection of its own."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from shared.infra import db
from shared.infra.ops import REGISTRY, add_ops_routes
from shared.infra.service import DatabaseProbe, pool_connections
from shared.infra.settings import Settings
from tests.serving import ProductionServer


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def test_each_route_is_timed_and_counted_by_status_and_a_failure_is_a_500() -> None:
    app = web.Application()
    registry = CollectorRegistry()
    app[REGISTRY] = registry

    async def boom(_: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    async def table(request: web.Request) -> web.Response:
        return web.json_response({"id": request.match_info["id"]})

    add_ops_routes(app, {})
    app.router.add_get("/boom", boom)
    app.router.add_get("/v1/tables/{id}", table)
    async with TestClient(ProductionServer(app)) as client:
        for path in ("/boom", "/v1/tables/a", "/v1/tables/b", "/no/such/path", "/healthz"):
            async with client.get(path) as response:
                await response.read()
        for method in ("PROPFIND", "MKCOL", "LOCK"):  # methods of no route add no series
            async with client.request(method, f"/{method}") as response:
                await response.read()
    answers = "gin_http_responses_total"
    assert value(registry, answers, method="GET", route="/boom", status="500") == 1
    assert value(registry, answers, method="GET", route="/v1/tables/{id}", status="200") == 2
    assert value(registry, answers, method="GET", route="unmatched", status="404") == 1
    assert value(registry, answers, method="GET", route="/healthz", status="200") == 1
    other = value(registry, answers, method="other", route="unmatched", status="405")
    other += value(registry, answers, method="other", route="unmatched", status="404")
    assert other == 3
    series = {
        s.labels["method"] for m in registry.collect() for s in m.samples if "method" in s.labels
    }
    assert series == {"GET", "other"}
    timed = "gin_http_request_seconds_count"
    assert value(registry, timed, method="GET", route="/v1/tables/{id}") == 2
    assert value(registry, "process_cpu_seconds_total") > 0
    assert value(registry, "process_open_fds") > 0
    assert any(m.name == "python_info" for m in registry.collect())


async def test_the_pool_reports_how_long_each_acquire_waited(settings: Settings) -> None:
    waits: list[float] = []
    pool = await db.create_pool(settings.database_url, "public", 1, 0.3, on_wait=waits.append)
    try:
        async with pool.acquire():
            with pytest.raises(db.PoolExhausted):
                async with pool.acquire():
                    pass
        async with pool.acquire():
            pass
    finally:
        pool.terminate()
    assert len(waits) == 3
    assert waits[1] >= 0.25  # the one that waited out the timeout
    assert waits[0] < 0.25
    assert waits[2] < 0.25


async def test_the_pool_reports_its_connections_held_idle_and_its_size(settings: Settings) -> None:
    """``gin_db_pool_connections``: read at each scrape, so a held connection shows at once."""
    app = web.Application()
    app[REGISTRY] = registry = CollectorRegistry()
    pool = await db.create_pool(settings.database_url, "public", 3, 5.0)
    try:
        pool_connections(app, pool)
        name = "gin_db_pool_connections"
        assert value(registry, name, state="max") == 3
        async with pool.acquire(), pool.acquire():
            assert value(registry, name, state="in_use") == 2
            idle_while_held = value(registry, name, state="idle")
        assert value(registry, name, state="in_use") == 0
        assert value(registry, name, state="idle") == idle_while_held + 2
    finally:
        pool.terminate()


async def test_readiness_has_its_own_connection_and_makes_it_again(settings: Settings) -> None:
    pool = await db.create_pool(settings.database_url, "public", 1, 5.0)
    probe = DatabaseProbe(settings.database_url)
    try:
        async with pool.acquire():  # every pool connection busy with a long move
            async with asyncio.timeout(1.0):
                await probe.check()  # not queued behind it
        assert probe.conn is not None
        probe.conn.terminate()  # lost (a restart): the next probe connects again
        await probe.check()
        assert not probe.conn.is_closed()
    finally:
        await probe.close()
        pool.terminate()
