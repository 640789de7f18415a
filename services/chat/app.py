"""The chat service's application: everything it opens is opened here, never at import."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aio_pika.abc import AbstractRobustConnection
from aiohttp import web
from prometheus_client import CollectorRegistry

from services.chat.chat import Chat
from services.chat.consumer import TableEventConsumer
from services.chat.http import (
    CHAT,
    METRICS,
    POOL,
    SETTINGS,
    ChatMetrics,
    add_routes,
    log_context,
    refusals,
)
from shared.infra import amqp, db
from shared.infra.ops import REGISTRY, add_ops_routes
from shared.infra.outbox import SQL_DIR, OutboxRelay, RelayMetrics
from shared.infra.settings import Settings

SCHEMA = "gin_chat"
MIGRATIONS = Path(__file__).parent / "migrations"
BROKER = web.AppKey("broker", AbstractRobustConnection)


async def migrate(settings: Settings) -> None:
    """Apply the chat service's migrations (also run as a Job before a deploy)."""
    await db.migrate_url(settings.database_url, SCHEMA, SQL_DIR, MIGRATIONS)


def create_app(settings: Settings, *, clock: Callable[[], float] = time.time) -> web.Application:
    """The whole chat service, ready for ``web.run_app`` or a test client."""
    app = web.Application(middlewares=[log_context, refusals])
    registry = CollectorRegistry()
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[METRICS] = ChatMetrics(registry)
    app[CHAT] = Chat(clock)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_broker)
    add_routes(app)
    add_ops_routes(
        app, {"postgresql": lambda: _ping_db(app), "rabbitmq": lambda: _ping_broker(app)}
    )
    return app


async def _database(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    await migrate(settings)
    pool = await db.create_pool(settings.database_url, SCHEMA, settings.db_pool_size)
    app[POOL] = pool
    yield
    await pool.close()


async def _broker(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    connection = await amqp.connect(settings.amqp_url)
    app[BROKER] = connection
    channel = await connection.channel(publisher_confirms=True)
    exchanges = await amqp.declare_topology(channel, settings.prefix)
    relay = OutboxRelay(
        app[POOL],
        SCHEMA,
        exchanges,
        settings.prefix,
        RelayMetrics(app[REGISTRY]),
        batch=settings.relay_batch,
        poll_s=settings.relay_poll_s,
    )
    consumer = TableEventConsumer(app[POOL], settings.prefix, app[REGISTRY])
    await consumer.start(connection)
    task = asyncio.create_task(relay.run(), name="chat-outbox-relay")
    yield
    await consumer.stop()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await connection.close()


async def _ping_db(app: web.Application) -> None:
    async with app[POOL].acquire() as conn:
        await conn.fetchval("SELECT 1")


async def _ping_broker(app: web.Application) -> None:
    if app[BROKER].is_closed:
        raise ConnectionError("the RabbitMQ connection is down")
