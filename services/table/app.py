"""The table service's application: everything it opens is opened here, never at import."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from services.table.consumer import CommandConsumer
from services.table.http import (
    COMMITTED,
    METRICS,
    POOL,
    SETTINGS,
    TABLES,
    CommandMetrics,
    add_routes,
    log_context,
    refusals,
)
from services.table.store import Change
from services.table.tables import Shuffle, Tables, secure_shuffle
from services.table.ws import HUB, Hub, add_socket_route
from shared.infra import amqp, db
from shared.infra.ops import REGISTRY, add_ops_routes
from shared.infra.outbox import SQL_DIR, OutboxRelay, RelayMetrics
from shared.infra.settings import Settings

SCHEMA = "gin_table"
MIGRATIONS = Path(__file__).parent / "migrations"
BROKER = web.AppKey("broker", object)


async def migrate(settings: Settings) -> None:
    """Apply the table service's migrations (also run as a Job before a deploy)."""
    await db.migrate_url(settings.database_url, SCHEMA, SQL_DIR, MIGRATIONS)


def create_app(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    shuffle: Shuffle = secure_shuffle,
) -> web.Application:
    """The whole table service, ready for ``web.run_app`` or a test client."""
    app = web.Application(middlewares=[log_context, refusals])
    registry = CollectorRegistry()
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[METRICS] = CommandMetrics(registry)
    app[TABLES] = Tables(
        settings.public_url, settings.absence_after_s, settings.expiry_after_s, clock, shuffle
    )
    app[COMMITTED] = lambda change: _deliver_local(app, change)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_broker)
    app.on_shutdown.append(_close_sockets)
    add_routes(app, settings.dev_tokens)
    add_socket_route(app)
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
    hub = Hub(app[POOL], app[TABLES], settings.prefix, app[REGISTRY])
    await hub.start(connection)
    app[HUB] = hub
    consumer = CommandConsumer(app[POOL], app[TABLES], settings.prefix, app[COMMITTED])
    await consumer.start(connection)
    task = asyncio.create_task(relay.run(), name="outbox-relay")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await connection.close()


async def _deliver_local(app: web.Application, change: Change) -> None:
    if HUB in app:
        await app[HUB].deliver_local(change.row, change.envelopes)


async def _close_sockets(app: web.Application) -> None:
    if HUB in app:
        await app[HUB].close_all()


async def _ping_db(app: web.Application) -> None:
    async with app[POOL].acquire() as conn:
        await conn.fetchval("SELECT 1")


async def _ping_broker(app: web.Application) -> None:
    connection = app[BROKER]
    if getattr(connection, "is_closed", True):
        raise ConnectionError("the RabbitMQ connection is down")
