"""The timer service's application: everything it opens is opened here, never at import."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg
from aio_pika.abc import AbstractRobustConnection
from aiohttp import web
from prometheus_client import CollectorRegistry

from services.timers.consumer import EventConsumer
from services.timers.deadlines import Durations
from services.timers.firing import DEFAULT_EXCHANGE, Firing
from services.timers.metrics import TimerMetrics
from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra import amqp, db
from shared.infra.ops import REGISTRY, add_ops_routes
from shared.infra.outbox import SQL_DIR, OutboxRelay, RelayMetrics
from shared.infra.settings import Settings

SCHEMA = "gin_timers"
MIGRATIONS = Path(__file__).parent / "migrations"
SETTINGS = web.AppKey("settings", Settings)
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")
METRICS = web.AppKey("metrics", TimerMetrics)
POOL = web.AppKey("pool", asyncpg.Pool)
BROKER = web.AppKey("broker", AbstractRobustConnection)
FIRING = web.AppKey("firing", Firing)
CONSUMER = web.AppKey("consumer", EventConsumer)


async def migrate(settings: Settings) -> None:
    """Apply the timer service's migrations (its deadlines and its outbox)."""
    await db.migrate_url(settings.database_url, SCHEMA, SQL_DIR, MIGRATIONS)


def create_app(settings: Settings, *, clock: Callable[[], float] = time.time) -> web.Application:
    """The whole timer service, ready for ``web.run_app`` or a test client."""
    app = web.Application()
    registry = CollectorRegistry()
    app[SETTINGS] = settings
    app[CLOCK] = clock
    app[REGISTRY] = registry
    app[METRICS] = TimerMetrics(registry)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_broker)
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
        {EVENTS_EXCHANGE: exchanges[EVENTS_EXCHANGE], DEFAULT_EXCHANGE: channel.default_exchange},
        settings.prefix,
        RelayMetrics(app[REGISTRY]),
        batch=settings.relay_batch,
        poll_s=settings.relay_poll_s,
    )
    firing = Firing(
        app[POOL],
        settings.prefix,
        app[CLOCK],
        app[METRICS],
        batch=settings.timer_batch,
        poll_s=settings.timer_poll_s,
        retry_s=settings.timer_retry_s,
    )
    app[FIRING] = firing
    consumer = EventConsumer(
        app[POOL],
        Durations(settings.absence_after_s, settings.expiry_after_s),
        settings.prefix,
        app[METRICS],
        firing.wake,
    )
    app[CONSUMER] = consumer
    await consumer.start(connection)
    tasks = [
        asyncio.create_task(relay.run(), name="timer-outbox-relay"),
        asyncio.create_task(firing.run(consumer.caught_up), name="timer-firing"),
    ]
    yield
    await consumer.stop()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await connection.close()


async def _ping_db(app: web.Application) -> None:
    async with app[POOL].acquire() as conn:
        await conn.fetchval("SELECT 1")


async def _ping_broker(app: web.Application) -> None:
    if app[BROKER].is_closed:
        raise ConnectionError("the RabbitMQ connection is down")
