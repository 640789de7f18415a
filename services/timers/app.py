"""The timer service's application: everything it opens is opened here, never at import."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from services.timers import retention
from services.timers.deadlines import BadReminders, Durations, reminder_offsets
from services.timers.firing import DEFAULT_EXCHANGE, Firing
from services.timers.metrics import TimerMetrics
from shared.contracts.names import COMMANDS_EXCHANGE, EVENTS_EXCHANGE
from shared.infra import service, tracing
from shared.infra.ops import REGISTRY
from shared.infra.service import BROKER, POOL, SETTINGS
from shared.infra.settings import Settings
from shared.infra.web import HEAD_READ_S

SCHEMA = "gin_timers"
MIGRATIONS = Path(__file__).parent / "migrations"
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")
METRICS = web.AppKey("metrics", TimerMetrics)
FIRING = web.AppKey("firing", Firing)
DURATIONS = web.AppKey("durations", Durations)


async def migrate(settings: Settings) -> None:
    """Apply the timer service's migrations (its deadlines and its outbox)."""
    await service.migrate(settings, SCHEMA, MIGRATIONS)


def durations_of(settings: Settings) -> Durations:
    """The absence and expiry times and the reminders' offsets; raises ``BadReminders`` on a
    ``GIN_TURN_REMINDERS_S`` the service cannot keep."""
    return Durations(
        settings.absence_after_s,
        settings.expiry_after_s,
        reminder_offsets(settings.turn_reminders_s, settings.absence_after_s),
    )


def create_app(settings: Settings, *, clock: Callable[[], float] = time.time) -> web.Application:
    """The whole timer service, ready for ``web.run_app`` or a test client (``BadReminders``
    on a bad ``GIN_TURN_REMINDERS_S``)."""
    durations = durations_of(settings)
    app = web.Application()
    registry = CollectorRegistry()
    app[SETTINGS] = settings
    app[HEAD_READ_S] = settings.head_read_s
    app[CLOCK] = clock
    app[DURATIONS] = durations
    app[REGISTRY] = registry
    app[METRICS] = TimerMetrics(registry, durations.reminders_s)
    app.cleanup_ctx.append(tracing.traced("timers"))  # first: the pool's statements traced
    app.cleanup_ctx.append(service.database(SCHEMA, MIGRATIONS))
    app.cleanup_ctx.append(retention.running(clock))  # archived tables' counters
    app.cleanup_ctx.append(_broker)
    service.add_health(app)
    return app


def create_checked_app(settings: Settings) -> web.Application:
    """The service as ``python -m services.timers`` runs it: an exit with one line naming
    the setting it cannot keep, not a traceback."""
    try:
        return create_app(settings)
    except BadReminders as exc:
        service.refuse(str(exc), settings)


async def _broker(app: web.Application) -> AsyncIterator[None]:
    """The firing loop and the relay of what fires."""
    settings = app[SETTINGS]
    channel, exchanges = await service.open_broker(app, "timers")
    outbound = {
        EVENTS_EXCHANGE: exchanges[EVENTS_EXCHANGE],
        COMMANDS_EXCHANGE: exchanges[COMMANDS_EXCHANGE],
        DEFAULT_EXCHANGE: exchanges[COMMANDS_EXCHANGE],
    }
    relay = service.relay(app, SCHEMA, channel, outbound)
    firing = Firing(
        app[POOL],
        settings.prefix,
        app[CLOCK],
        app[METRICS],
        app[DURATIONS],
        batch=settings.timer_batch,
        poll_s=settings.timer_poll_s,
        retry_s=settings.timer_retry_s,
    )
    app[FIRING] = firing
    tasks = [
        asyncio.create_task(relay.run(), name="timer-outbox-relay"),
        asyncio.create_task(firing.run(), name="timer-firing"),
    ]
    yield
    await service.cancel(*tasks)
    await app[BROKER].close()
