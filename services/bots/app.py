"""The bot worker's application: health, readiness and metrics over HTTP; the worker inside."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from aio_pika.abc import AbstractRobustConnection
from aiohttp import web
from prometheus_client import CollectorRegistry

from services.bots.worker import BotMetrics, BotWorker, Strategy
from shared.infra import amqp
from shared.infra.ops import REGISTRY, add_ops_routes
from shared.infra.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
CONNECTION = web.AppKey("connection", AbstractRobustConnection)
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
    registry = CollectorRegistry()
    app[REGISTRY] = registry
    worker = BotWorker(strategies, settings.prefix, settings.bot_think_s, BotMetrics(registry))

    async def broker(app: web.Application) -> AsyncIterator[None]:
        connection = await amqp.connect(settings.amqp_url)
        app[CONNECTION] = connection
        channel = await connection.channel()
        await amqp.declare_topology(channel, settings.prefix)
        await channel.close()
        await worker.start(connection, PREFETCH)
        yield
        await connection.close()

    async def broker_up() -> None:
        if app[CONNECTION].is_closed:
            raise ConnectionError("the RabbitMQ connection is down")

    app.cleanup_ctx.append(broker)
    add_ops_routes(app, {"rabbitmq": broker_up})
    return app
