"""The table service's application: everything it opens is opened here, never at import."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from services.table import archive, backfill
from services.table.bot_turns import BotTurnResend
from services.table.commits import GroupCommit
from services.table.consumer import CommandConsumer
from services.table.dev_page import add_dev_page
from services.table.handling import CommandMetrics, Commands
from services.table.http import (
    COMMANDS,
    COMMITTED,
    GROUP_COMMIT,
    LISTER,
    METRICS,
    TABLES,
    add_routes,
    refusals,
)
from services.table.lobby import LOBBY_KEY, Lobby
from services.table.maintenance import Maintenance
from services.table.store import Change
from services.table.tables import Shuffle, Tables, secure_shuffle
from services.table.ws import FILES, HUB, MEMORY, Hub, add_socket_route
from shared.contracts.names import SOCKETS_EXCHANGE
from shared.infra import service, tracing
from shared.infra.compression import answer_compression
from shared.infra.consumer import ConsumerMetrics
from shared.infra.files import FileBudget
from shared.infra.memory import MemoryBudget
from shared.infra.ops import REGISTRY
from shared.infra.outbox import OutboxRelay
from shared.infra.service import BROKER, POOL, SETTINGS
from shared.infra.settings import Settings
from shared.infra.web import BODY_READ_S, HEAD_READ_S, not_stored

log = structlog.get_logger()
SCHEMA = "gin_table"
MIGRATIONS = Path(__file__).parent / "migrations"
RELAY = web.AppKey("relay", OutboxRelay)
MAINTENANCE = web.AppKey("maintenance", Maintenance)


async def migrate(settings: Settings) -> None:
    """Apply the table service's migrations (also run as a Job before a deploy)."""
    await service.migrate(settings, SCHEMA, MIGRATIONS)


def create_app(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    shuffle: Shuffle = secure_shuffle,
) -> web.Application:
    """The whole table service, ready for ``web.run_app`` or a test client."""
    app = web.Application(
        middlewares=[*answer_compression(settings), not_stored, tracing.middleware, refusals],
        client_max_size=settings.max_body_bytes,
    )
    registry = CollectorRegistry()
    app[SETTINGS] = settings
    app[BODY_READ_S] = settings.body_read_s
    app[HEAD_READ_S] = settings.head_read_s
    app[REGISTRY] = registry
    app[METRICS] = CommandMetrics(registry)
    app[TABLES] = Tables(
        settings.public_url,
        settings.absence_after_s,
        settings.expiry_after_s,
        clock,
        shuffle,
        bot_resend_s=settings.bot_turn_resend_s,
        rows_kept=settings.table_rows_kept,
    )
    app[COMMITTED] = lambda change: _committed(app, change)
    # Under the limit as the process has it now (``service.main`` raised it first).
    app[FILES] = FileBudget.of_process(settings.files_reserve)
    app[MEMORY] = MemoryBudget.of_process(settings.memory_limit_bytes, settings.memory_full_share)
    app.cleanup_ctx.append(tracing.traced("table"))  # first: the pool's statements traced
    app.cleanup_ctx.append(service.database(SCHEMA, MIGRATIONS))
    app.cleanup_ctx.append(_group_commit)
    app.cleanup_ctx.append(_broker)
    app.cleanup_ctx.append(lambda app: _maintenance(app, clock))
    app.on_shutdown.append(_close_sockets)
    add_routes(app, settings.dev_tokens)
    add_socket_route(app)
    if settings.dev_tokens:  # the reference client: development only
        add_dev_page(app)
    service.add_health(app)
    return app


async def _group_commit(app: web.Application) -> AsyncIterator[None]:
    """People's commands on remembered rows, saved many to a statement (``commits.py``)."""
    settings = app[SETTINGS]
    app[GROUP_COMMIT] = GroupCommit(
        app[POOL],
        app[COMMITTED],
        app[REGISTRY],
        statements=settings.group_commit_statements,
        most=settings.group_commit_changes,
    )
    app[COMMANDS] = Commands(
        app[POOL], app[TABLES], app[GROUP_COMMIT], app[METRICS], app[COMMITTED]
    )
    yield
    await app[GROUP_COMMIT].close()


async def _broker(app: web.Application) -> AsyncIterator[None]:
    """The relay, this replica's WebSocket hub and the command consumer."""
    settings = app[SETTINGS]
    channel, exchanges = await service.open_broker(app, "table")
    hub = Hub(app[POOL], app[TABLES], settings.prefix, app[REGISTRY], settings.ws_send_queue)
    await hub.start(app[BROKER])
    app[HUB] = hub
    lobby = Lobby(app[POOL], app[LISTER], hub)
    hub.heard, hub.others, hub.reopened = lobby.heard, lobby.clients, lobby.resync
    lobby.start()
    app[LOBBY_KEY] = lobby
    consumer = CommandConsumer(app[COMMANDS], settings.prefix, ConsumerMetrics(app[REGISTRY]))
    await consumer.start(app[BROKER])
    app[RELAY] = service.relay(app, SCHEMA, channel, exchanges, digest_to=SOCKETS_EXCHANGE)
    # Apart (GIN_RELAY_APART), the relay's process publishes; this replica's relay object only
    # sends the NOTIFY that wakes it (``OutboxRelay.committed``).
    relay = (
        None if settings.relay_apart else asyncio.create_task(app[RELAY].run(), name="outbox-relay")
    )
    resend = BotTurnResend(
        app[POOL],
        app[TABLES],
        app[REGISTRY],
        app[RELAY].committed,
        resend_s=settings.bot_turn_resend_s,
    )
    resending = asyncio.create_task(resend.run(), name="bot-turn-resend")
    filling = asyncio.create_task(backfill.run(app[POOL]), name="deadlines-backfill")
    yield
    await consumer.stop()
    await service.cancel(resending, filling, *([] if relay is None else [relay]))
    await lobby.stop()
    await hub.stop()
    await app[RELAY].close()
    await app[BROKER].close()


async def _maintenance(app: web.Application, clock: Callable[[], float]) -> AsyncIterator[None]:
    """The maintenance task (``maintenance.py``: the event log's months made ahead, old
    command answers deleted, ended tables archived (``archive.py``)): every replica runs it,
    one at a time holds its lock and works. The replicas, not the relay's process: they
    always run, and with the service's clock."""
    app[MAINTENANCE] = Maintenance(app[POOL], app[SETTINGS], app[REGISTRY], clock, SCHEMA)
    step = archive.archive_step(app[POOL], app[SETTINGS])
    if step is not None:  # GIN_ARCHIVE_URL set: ended tables go to the archive
        app[MAINTENANCE].steps.append(("archive", step))
    task = asyncio.create_task(app[MAINTENANCE].run(), name="maintenance")
    yield
    await service.cancel(task)


def create_relay_app(settings: Settings) -> web.Application:
    """The table's outbox relay alone (``python -m services.table.relay``): with
    ``GIN_RELAY_APART`` the replicas commit and wake it by NOTIFY, and this process publishes,
    so a replica's event loop spends nothing on publishing (a share of its CPU at saturation:
    docs/DESIGN.md, section 2) and no replica, the one holding the relay's lock, publishes for
    all the others. Two of them
    may run: one publishes at a time (the advisory lock), the other takes over."""
    app = web.Application()
    app[SETTINGS] = settings
    app[HEAD_READ_S] = settings.head_read_s
    app[REGISTRY] = CollectorRegistry()
    app.cleanup_ctx.append(tracing.traced("table-relay"))
    app.cleanup_ctx.append(service.database(SCHEMA, MIGRATIONS))
    app.cleanup_ctx.append(_relay_only)
    service.add_health(app)
    return app


async def _relay_only(app: web.Application) -> AsyncIterator[None]:
    channel, exchanges = await service.open_broker(app, "table")
    app[RELAY] = service.relay(app, SCHEMA, channel, exchanges, digest_to=SOCKETS_EXCHANGE)
    relay = asyncio.create_task(app[RELAY].run(), name="outbox-relay")
    yield
    await service.cancel(relay)
    await app[RELAY].close()
    await app[BROKER].close()


def _committed(app: web.Application, change: Change) -> None:
    """After a commit: the relay is woken to publish its outbox rows, and the hub is handed
    the change to deliver to this replica's sockets after the answer. Neither waits on a
    socket, and neither may fail the command: it is committed, and the relay's poll and the
    sockets' gap fill make up for what did not happen here."""
    app[TABLES].committed(change.row)
    try:
        if RELAY in app and change.outbox:
            app[RELAY].committed()
    except Exception:
        log.exception("relay_wake_failed", table_id=change.row.table_id)
    try:
        if HUB in app:
            app[HUB].committed(change)
    except Exception:
        log.exception("ws_handoff_failed", table_id=change.row.table_id)


async def _close_sockets(app: web.Application) -> None:
    if HUB in app:
        await app[HUB].close_all()
