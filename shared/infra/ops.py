"""The routes every service answers: /healthz, /readyz and Prometheus /metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

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

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
