"""The bot worker's application: health, readiness and metrics over HTTP; the worker inside."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry

from services.bots.worker import BotMetrics, BotWorker, Strategy
from shared.infra import service, tracing
from shared.infra.consumer import ConsumerMetrics
from shared.infra.ops import REGISTRY
from shared.infra.service import BROKER, SETTINGS
from shared.infra.settings import Settings
from shared.infra.web import HEAD_READ_S

PREFETCH = 8


def create_app(
    settings: Settings, strategies: Mapping[str, Strategy] | None = None
) -> web.Application:
    """The bot worker for every level (or the given strategies by level)."""
    if strategies is None:
        from services.bots.strategies import STRATEGIES

        strategies = STRATEGIES
    app = web.Application()
    app[SETTINGS] = settings
    app[HEAD_READ_S] = settings.head_read_s
    registry = CollectorRegistry()
    app[REGISTRY] = registry
    worker = BotWorker(
        strategies,
        settings.prefix,
        settings.bot_think_s,
        BotMetrics(registry),
        ConsumerMetrics(registry),
    )

    async def broker(app: web.Application) -> AsyncIterator[None]:
        channel, _ = await service.open_broker(app, "bots")
        await channel.close()
        await worker.start(app[BROKER], PREFETCH)
        yield
        await worker.stop()
        await app[BROKER].close()

    app.cleanup_ctx.append(tracing.traced("bots"))
    app.cleanup_ctx.append(broker)
    service.add_health(app, database=False)
    return app
