"""The chat service's application: everything it opens is opened here, never at import."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from services.chat import retention
from services.chat.chat import Chat
from services.chat.consumer import TableEventConsumer
from services.chat.dev_cors import allow_dev_page
from services.chat.http import CHAT, METRICS, ChatMetrics, add_routes, refusals
from shared.infra import service, tracing
from shared.infra.compression import answer_compression
from shared.infra.consumer import ConsumerMetrics
from shared.infra.ops import REGISTRY
from shared.infra.service import BROKER, POOL, SETTINGS
from shared.infra.settings import Settings
from shared.infra.web import BODY_READ_S, HEAD_READ_S, not_stored

SCHEMA = "gin_chat"
MIGRATIONS = Path(__file__).parent / "migrations"


async def migrate(settings: Settings) -> None:
    """Apply the chat service's migrations (also run as a Job before a deploy)."""
    await service.migrate(settings, SCHEMA, MIGRATIONS)


def create_app(settings: Settings, *, clock: Callable[[], float] = time.time) -> web.Application:
    """The whole chat service, ready for ``web.run_app`` or a test client."""
    app = web.Application(
        middlewares=[*answer_compression(settings), not_stored, tracing.middleware, refusals],
        client_max_size=settings.max_body_bytes,
    )
    registry = CollectorRegistry()
    app[SETTINGS] = settings
    app[BODY_READ_S] = settings.body_read_s
    app[HEAD_READ_S] = settings.head_read_s
    app[REGISTRY] = registry
    app[METRICS] = ChatMetrics(registry)
    app[CHAT] = Chat(clock)
    app.cleanup_ctx.append(tracing.traced("chat"))  # first: the pool's statements traced
    app.cleanup_ctx.append(service.database(SCHEMA, MIGRATIONS))
    app.cleanup_ctx.append(retention.running)  # an ended table's chat, once it is archived
    app.cleanup_ctx.append(_broker)
    add_routes(app)
    if settings.dev_tokens:  # the reference client on the table service's origin
        allow_dev_page(app, settings.public_url)
    service.add_health(app)
    return app


async def _broker(app: web.Application) -> AsyncIterator[None]:
    """The relay of chat messages and the consumer of table events."""
    channel, exchanges = await service.open_broker(app, "chat")
    consumer = TableEventConsumer(
        app[POOL], app[SETTINGS].prefix, app[REGISTRY], ConsumerMetrics(app[REGISTRY])
    )
    await consumer.start(app[BROKER])
    relay = asyncio.create_task(
        service.relay(app, SCHEMA, channel, exchanges).run(), name="chat-outbox-relay"
    )
    yield
    await consumer.stop()
    await service.cancel(relay)
    await app[BROKER].close()
