"""The services that verify tokens refuse to start with unsafe token settings (issue 13, part
5): ``python -m services.table`` and ``services.chat`` exit 1 with one line, before they open
anything; the migrations, which verify no tokens, are not refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import aio_pika
import aiormq.exceptions
import msgspec
import pytest
from aiohttp import web

from shared.contracts.names import DEAD_LETTER
from shared.infra import amqp, service
from shared.infra.auth import UnsafeTokenSettings, check_token_settings
from shared.infra.settings import Settings
from tests.e2e.processes import ROOT, Service, free_port

GOOD_SECRET = "a-production-like-secret-of-at-least-32-bytes"
# Nothing listens there: a service that got past the check would fail on these, differently.
NOWHERE = {
    "GIN_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/postgres",
    "GIN_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/",
}


def run(module: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m <module>`` with only these GIN_* variables (none of the test run's)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GIN_")}
    clean.update(NOWHERE, GIN_HTTP_PORT=str(free_port()), GIN_LOG_FORMAT="console", **env)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=clean,
        cwd=ROOT,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
    )


def refusal(env: dict[str, str]) -> str:
    """The message check_token_settings gives for these variables."""
    with pytest.raises(UnsafeTokenSettings) as error:
        check_token_settings(Settings.from_env(env))
    return str(error.value)


REFUSED = [
    ({}, "GIN_AUTH_SECRET is the public default"),
    ({"GIN_DEV_TOKENS": "false"}, "GIN_AUTH_SECRET is the public default"),
    ({"GIN_AUTH_SECRET": "s" * 31}, "31 bytes, fewer than 32"),
    ({"GIN_AUTH_SECRET": "s" * 40 + "\udcff"}, "not UTF-8"),  # a raw byte in the Secret
    (
        {"GIN_DEV_TOKENS": "true", "GIN_PUBLIC_URL": "https://selminha.com"},
        "GIN_DEV_TOKENS is on while GIN_PUBLIC_URL is https",
    ),
    (
        {
            "GIN_DEV_TOKENS": "true",
            "GIN_AUTH_SECRET": GOOD_SECRET,
            "GIN_PUBLIC_URL": "https://selminha.com",
        },
        "GIN_DEV_TOKENS is on while GIN_PUBLIC_URL is https",
    ),
]


@pytest.mark.parametrize("module", ["services.table", "services.chat"])
@pytest.mark.parametrize(("env", "expected"), REFUSED)
def test_a_service_that_verifies_tokens_refuses_unsafe_settings(
    module: str, env: dict[str, str], expected: str
) -> None:
    done = run(module, env)
    assert done.returncode == 1, done
    assert done.stderr.splitlines() == [f"refusing to start: {refusal(env)}"], done.stderr
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_settings_started_as_a_process_read_back_the_same(settings: Settings) -> None:
    # tests start services as processes with the run's settings through the environment
    assert Settings.from_env(settings.to_env()) == settings
    assert Settings.from_env(Settings().to_env()) == Settings()


def test_the_migrations_are_not_refused(settings: Settings) -> None:
    """The migrations Job is given no secret (least privilege): it must still run."""
    done = run("services.table", {"GIN_DATABASE_URL": settings.database_url}, "migrate")
    assert done.returncode == 0, done.stderr


async def test_safe_production_settings_start(settings: Settings) -> None:
    """A real secret without development tokens, over https: the service starts and serves."""
    production = msgspec.structs.replace(
        settings, dev_tokens=False, auth_secret=GOOD_SECRET, public_url="https://selminha.com"
    )
    service = Service("services.table", production)
    try:
        await service.ready()
    finally:
        service.stop()
    assert service.proc.returncode == 0


async def test_a_queue_the_broker_is_still_recovering_is_declared_again() -> None:
    """Just after a node restarts, declaring a queue it has not yet recovered answers NOT_FOUND
    ("home node ... is down or inaccessible") and closes the channel: startup tries again on a
    new channel instead of failing (seen in CI, the app started moments after a restart)."""
    recovering = aiormq.exceptions.ChannelNotFoundEntity(
        "NOT_FOUND - home node 'gin@localhost' of durable queue 'gin.events.history' in vhost"
        " '/' is down or inaccessible"
    )
    attempts: list[int] = []

    async def declare() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise recovering
        return "declared"

    assert service.recovering_topology(recovering)
    assert await service.until_reachable("topology", declare, 5.0, service.recovering_topology)
    assert len(attempts) == 3


async def test_a_declaration_refused_for_good_fails_startup_at_once(settings: Settings) -> None:
    """A queue declared with other arguments than the broker's (PRECONDITION_FAILED) is a
    deploy's mistake: startup fails on the first attempt, with the broker's words, instead of
    waiting out STARTUP_WAIT_S."""
    own = msgspec.structs.replace(settings, prefix=f"{settings.prefix}refused.")
    connection = await aio_pika.connect(own.amqp_url)
    async with connection:
        channel = await connection.channel()
        # The dead-letter queue, classic and without its arguments, as an old deploy left it.
        squatter = await channel.declare_queue(own.prefix + DEAD_LETTER, durable=True)
        try:
            app = web.Application()
            app[service.SETTINGS] = own
            started = time.monotonic()
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="PRECONDITION"):
                await service.open_broker(app, "table")
            assert time.monotonic() - started < service.STARTUP_WAIT_S / 2
            await app[service.BROKER].close()
        finally:
            await squatter.delete(if_unused=False, if_empty=False)
            cleanup = await connection.channel()
            await amqp.delete_topology(cleanup, own.prefix)
