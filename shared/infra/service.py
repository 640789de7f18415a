"""What every service's app does the same way: its database, broker, relay, health, main.

A service's ``create_app`` composes these; nothing here opens anything at import.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import NoReturn, TypeVar

import aiormq.exceptions
import asyncpg
import msgspec
import structlog
import uvloop
from aio_pika.abc import AbstractExchange, AbstractRobustChannel, AbstractRobustConnection
from aiohttp import web
from prometheus_client import Gauge, Histogram

from shared.infra import amqp, db, files, serving, tracing
from shared.infra.auth import UnsafeTokenSettings, check_token_settings
from shared.infra.consumer import transient
from shared.infra.internals import UntestedVersion, check_versions
from shared.infra.logs import configure
from shared.infra.ops import REGISTRY, add_ops_routes
from shared.infra.outbox import SQL_DIR, OutboxRelay, RelayMetrics
from shared.infra.settings import Settings, env_name

log = structlog.get_logger()
SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
BROKER = web.AppKey("broker", AbstractRobustConnection)
CleanupCtx = Callable[[web.Application], AsyncIterator[None]]
T = TypeVar("T")


async def migrate(settings: Settings, schema: str, migrations: Path) -> None:
    """Apply a service's migrations, its outbox's first (also run as a Job before a deploy)."""
    await db.migrate_url(settings.database_url, schema, SQL_DIR, migrations)


def database(schema: str, migrations: Path) -> CleanupCtx:
    """A cleanup context: migrate, open the pool in the service's schema, close it."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        await until_reachable("database", lambda: migrate(settings, schema, migrations))
        app[POOL] = await until_reachable(
            "database",
            lambda: db.create_pool(
                settings.database_url,
                schema,
                settings.db_pool_size,
                acquire_timeout_s=settings.db_acquire_timeout_s,
                statement_timeout_s=settings.db_statement_timeout_s,
                on_wait=pool_wait(app).observe,
            ),
        )
        pool_connections(app, app[POOL])
        yield
        await close_pool(app[POOL], settings.shutdown_grace_s)

    return ctx


STARTUP_WAIT_S = 90.0  # under the pods' startupProbe (2 s x 60): then exit, and be restarted


async def until_reachable(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    within_s: float | None = None,
    retry: Callable[[BaseException], bool] = transient,
) -> T:
    """``attempt()``, tried again while it fails transiently (``retry``, by default
    ``consumer.transient``: the server down, restarting or refusing connections) for
    ``within_s`` (``STARTUP_WAIT_S``): a service started during an outage waits for it to end
    and starts then, instead of exiting into a restart loop whose back-off outlasts the
    outage."""
    deadline = time.monotonic() + (STARTUP_WAIT_S if within_s is None else within_s)
    pause = 0.2
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not retry(exc) or time.monotonic() + pause > deadline:
                raise
            log.warning(f"waiting_for_{what}", error=repr(exc), retry_in_s=pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 5.0)


def pool_wait(app: web.Application) -> Histogram:
    """The histogram of how long each database connection was waited for."""
    return Histogram(
        "gin_db_pool_wait_seconds",
        "Time a request or message waited for a database connection (over"
        " GIN_DB_ACQUIRE_TIMEOUT_S: answered 503 busy)",
        registry=app[REGISTRY],
        buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
    )


def pool_connections(app: web.Application, pool: asyncpg.Pool) -> Gauge:
    """The gauge of the pool's connections by state, read at each scrape: ``in_use`` (held by a
    request or message), ``idle`` (open, free) and ``max`` (``GIN_DB_POOL_SIZE``). In use near
    max while ``gin_db_pool_wait_seconds`` climbs: the pool, not the database, is the limit."""
    gauge = Gauge(
        "gin_db_pool_connections",
        "Database pool connections by state: in_use, idle, max (GIN_DB_POOL_SIZE)",
        ["state"],
        registry=app[REGISTRY],
    )
    gauge.labels("in_use").set_function(lambda: pool.get_size() - pool.get_idle_size())
    gauge.labels("idle").set_function(pool.get_idle_size)
    gauge.labels("max").set_function(pool.get_max_size)
    return gauge


async def close_pool(pool: asyncpg.Pool, grace_s: float) -> None:
    """Close a pool: wait ``grace_s`` at most for its connections to come back, then
    terminate it (a connection a stuck task holds would hold the shutdown for good)."""
    try:
        async with asyncio.timeout(grace_s):
            await pool.close()
    except TimeoutError:
        log.error("pool_close_timed_out", grace_s=grace_s)
        pool.terminate()


async def open_broker(
    app: web.Application, service: str
) -> tuple[AbstractRobustChannel, dict[str, AbstractExchange]]:
    """Connect (robustly), declare the service's part of the topology
    (``amqp.declare_topology``); a confirming channel and the exchanges it publishes to."""
    settings = app[SETTINGS]
    broker = app[BROKER] = await until_reachable("broker", lambda: amqp.connect(settings.amqp_url))

    async def declared() -> tuple[AbstractRobustChannel, dict[str, AbstractExchange]]:
        channel = await broker.channel(publisher_confirms=True)
        try:
            return channel, await amqp.declare_topology(channel, settings.prefix, service)
        except BaseException:
            if not channel.is_closed:
                await channel.close()
            raise

    return await until_reachable("broker_topology", declared, retry=recovering_topology)


def recovering_topology(exc: BaseException) -> bool:
    """Whether a declaration failed only because the broker is still recovering its queues.

    Just after a node (re)starts, declaring a durable queue it has not yet recovered (a
    stream's leader not yet elected, a classic queue's home node "down or inaccessible")
    answers ``NOT_FOUND`` and closes the channel: a new channel succeeds moments later. A
    declaration the broker refuses for good (arguments unlike the existing queue's, access
    refused) is not retried: it is a deploy's mistake, to be read in the log at once."""
    if isinstance(
        exc,
        aiormq.exceptions.ChannelPreconditionFailed
        | aiormq.exceptions.ChannelAccessRefused
        | aiormq.exceptions.ChannelLockedResource,
    ):
        return False
    return transient(exc)


def relay(
    app: web.Application,
    schema: str,
    channel: AbstractRobustChannel,
    exchanges: Mapping[str, AbstractExchange],
    digest_to: str | None = None,
) -> OutboxRelay:
    """The outbox relay of a service's schema (publishing on a confirming channel), with its
    metrics on the app's registry; ``digest_to`` as for ``OutboxRelay``."""
    settings = app[SETTINGS]
    return OutboxRelay(
        app[POOL],
        schema,
        channel,
        exchanges,
        RelayMetrics(app[REGISTRY]),
        batch=settings.relay_batch,
        poll_s=settings.relay_poll_s,
        linger_s=settings.relay_linger_s,
        digest_to=digest_to,
        retention_s=settings.outbox_retention_s,
    )


async def cancel(*tasks: asyncio.Task[None], grace_s: float = 10.0) -> None:
    """Cancel background tasks and wait for them to end, ``grace_s`` at most: a task still
    running then (it swallowed its cancellation) is logged, not waited for. A task's own
    failure is raised; a cancellation of the caller is not swallowed."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, running = await asyncio.wait(tasks, timeout=grace_s)
    for task in running:
        log.error("task_ignored_its_cancellation", task=task.get_name(), grace_s=grace_s)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.result()


class DatabaseProbe:
    """Readiness's own PostgreSQL connection, not one of the pool's: a probe never queues
    behind players' moves for a connection (a busy replica is not a broken one), and a lost
    connection is made again at the next probe."""

    def __init__(self, url: str, timeout_s: float = 1.5) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.conn: asyncpg.Connection | None = None
        self.lock = asyncio.Lock()

    async def check(self) -> None:
        """``SELECT 1`` on the probe's connection (made first if need be); raise if it fails."""
        async with self.lock:
            try:
                if self.conn is None or self.conn.is_closed():
                    self.conn = await asyncpg.connect(
                        self.url,
                        timeout=self.timeout_s,
                        server_settings={"application_name": "gin-readiness"},
                    )
                await self.conn.fetchval("SELECT 1", timeout=self.timeout_s)
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        """Close the probe's connection, if any (never raises)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.terminate()


async def every(
    seconds: float, work: Callable[[], Awaitable[object]], failed: str, backoff_s: float = 5.0
) -> None:
    """Run ``work`` now and every ``seconds`` until cancelled; one that fails (a database
    away) is logged as ``failed`` and tried again after ``backoff_s`` (no later than
    ``seconds``). The maintenance of the table and of the chat run so."""
    while True:
        pause = seconds
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            pause = min(pause, backoff_s)
            log.warning(failed, error=repr(exc), retry_in_s=pause)
        await asyncio.sleep(pause)


def add_health(app: web.Application, database: bool = True) -> None:
    """/healthz, /readyz (PostgreSQL and RabbitMQ reachable) and /metrics.

    PostgreSQL is probed on a connection of its own (``DatabaseProbe``); RabbitMQ by whether
    the robust connection is connected now (it is never "closed" while it reconnects)."""
    probe: DatabaseProbe | None = None

    async def postgresql() -> None:
        nonlocal probe
        if probe is None:
            probe = DatabaseProbe(app[SETTINGS].database_url)
        await probe.check()

    async def close_probe(_: web.Application) -> None:
        if probe is not None:
            await probe.close()

    async def rabbitmq() -> None:
        if BROKER not in app or app[BROKER].is_closed:
            raise ConnectionError("the RabbitMQ connection is closed")
        if not app[BROKER].connected.is_set():
            raise ConnectionError("RabbitMQ is unreachable: reconnecting")

    checks: dict[str, Callable[[], Awaitable[object]]] = {"rabbitmq": rabbitmq}
    if database:
        checks = {"postgresql": postgresql, **checks}
        app.on_cleanup.append(close_probe)
    add_ops_routes(app, checks)
    app.cleanup_ctx.append(young_heap)


async def young_heap(app: web.Application) -> AsyncIterator[None]:
    """Keep the collector's work to what is new (``GIN_GC_THAW_S``; 0: off), in short pauses
    (``GIN_GC_FULL_EVERY_S``).

    A full collection scans every object the process holds, and a replica holding thousands
    of sockets holds a great many: each such pause holds every command and socket of the
    process. So right after each full collection the survivors are frozen (``gc.freeze``):
    the next one scans only what came since. A frozen object is never collected as part of a
    cycle, so once every ``GIN_GC_THAW_S`` everything is thawed and collected in one full
    pause (its length is in ``gin_gc_pause_seconds``), which reclaims the cycles that died
    frozen (each closed socket leaves some) and bounds what they hold.

    Left to Python, the next full collection comes once what was promoted since the last one
    reaches a quarter of what survived it: rarely, over everything since, in one pause long
    enough to show in the players' tail. A full collection every ``GIN_GC_FULL_EVERY_S`` scans
    the same objects once each, in short pauses (deploy/README.md, "Scale", has the figures
    measured both ways)."""
    settings = app[SETTINGS]
    thaw_s = settings.gc_thaw_s
    if thaw_s <= 0:
        yield
        return
    loop = asyncio.get_running_loop()

    def after_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            loop.call_soon_threadsafe(gc.freeze)  # not inside the collector's own callback

    gc.callbacks.append(after_collection)
    tasks = [asyncio.create_task(_thaw_every(thaw_s), name="heap-thaw")]
    if settings.gc_full_every_s > 0:
        tasks.append(
            asyncio.create_task(_collect_every(settings.gc_full_every_s), name="heap-collect")
        )
    try:
        yield
    finally:
        gc.callbacks.remove(after_collection)
        await cancel(*tasks)


async def _collect_every(every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        gc.collect(2)  # frozen by the callback once it is done


async def _thaw_every(thaw_s: float) -> None:
    while True:
        await asyncio.sleep(thaw_s)
        gc.unfreeze()
        gc.collect()  # frozen again by the callback once it is done
        log.info("heap_thawed_and_collected", next_in_s=thaw_s)


def main(
    create_app: Callable[[Settings], web.Application],
    migrate_only: Callable[[Settings], Coroutine[object, object, None]] | None = None,
    default_port: int | None = None,
    verifies_tokens: bool = False,
) -> None:
    """Run a service until SIGTERM or SIGINT, then drain; ``migrate`` as the only argument
    applies its migrations and exits. ``default_port`` applies when GIN_HTTP_PORT is unset.
    A service that ``verifies_tokens`` exits at once (one line, status 1) with settings it
    must not verify them with (``auth.check_token_settings``); every service exits so on a
    library version ``internals`` was not tested with. Before its app is made, a service
    raises its soft limit on open files to the hard one (``files.raise_limit``)."""
    try:
        settings = Settings.from_env()
    except msgspec.ValidationError as exc:
        refuse(f"a setting is not valid: {exc}")
    refuse_untested_versions(settings)
    try:
        tracing.configured()
    except ValueError as exc:
        refuse(str(exc), settings)
    if default_port is not None and env_name("http_port") not in os.environ:
        settings = msgspec.structs.replace(settings, http_port=default_port)
    configure(settings.log_format, settings.log_level, service_name(create_app))
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if sys.argv[1:] == ["migrate"]:
        if migrate_only is None:
            refuse("this service has no database to migrate", settings)
        asyncio.run(migrate_only(settings))
        return
    if verifies_tokens:
        refuse_unsafe_token_settings(settings)
    files.raise_limit()  # before the app: it may read the limit (the table's FileBudget)
    app = create_app(settings)
    app.on_startup.append(_freeze_heap)
    serving.run(
        app,
        host=settings.http_host,
        port=settings.http_port,
        backlog=settings.http_backlog,
        shutdown_timeout=settings.shutdown_grace_s,
        access_log=logging.getLogger("aiohttp.access") if settings.access_log else None,
    )


def service_name(create_app: Callable[..., object]) -> str:
    """``table`` for ``services.table.app.create_app``: the ``service`` of its log lines."""
    parts = create_app.__module__.split(".")
    return parts[1] if parts[0] == "services" and len(parts) > 1 else create_app.__module__


def refuse(reason: str, settings: Settings | None = None) -> NoReturn:
    """Exit 1 with one line on stderr: a JSON object when the logs are JSON (the default),
    else ``refusing to start: <reason>``."""
    log_format = settings.log_format if settings else os.environ.get(env_name("log_format"), "json")
    if log_format == "json":
        line = {"event": "refusing_to_start", "level": "critical", "reason": reason}
        sys.stderr.write(msgspec.json.encode(line).decode() + "\n")
        sys.exit(1)
    sys.exit(f"refusing to start: {reason}")


def refuse_untested_versions(settings: Settings | None = None) -> None:
    """Exit with one line when asyncpg or aiormq is at a version whose internals
    (``shared/infra/internals.py``) were not tested."""
    try:
        check_versions()
    except UntestedVersion as exc:
        refuse(str(exc), settings)


def refuse_unsafe_token_settings(settings: Settings) -> None:
    """Exit with one line, not a traceback, when the token settings are unsafe (the
    migrations are not refused: they verify no tokens and are given no secret)."""
    try:
        check_token_settings(settings)
    except UnsafeTokenSettings as exc:
        refuse(str(exc), settings)


async def _freeze_heap(app: web.Application) -> None:
    """Once started, move what the process holds for good (modules, the engine's tables, the
    app) out of the collector's reach: a full collection then scans only what came since,
    instead of pausing the event loop over all of it (every command waiting behind it)."""
    gc.collect()
    gc.freeze()
