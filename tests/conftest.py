"""Servers for the tests that need them: real PostgreSQL and RabbitMQ, never mocks.

The servers come from the settings (``GIN_DATABASE_URL``, ``GIN_AMQP_URL``); else from
testcontainers when a Docker engine answers; else from ``scripts/servers.py`` (the standard
local ports, or throwaway servers it installs and starts). Every run gets its own database
and its own exchange and queue prefix, so runs never collide; under ``make test``'s two
pytest-xdist workers each worker is a run of its own (its session fixtures are its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import msgspec
import pytest

from shared.infra import amqp
from shared.infra.settings import Settings
from tests.fuzz import tally

ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = ROOT / ".run" / "servers"


def _docker_engine_answers() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _from_servers_script() -> tuple[str, str]:
    env_file = STATE_DIR / "servers.env"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "servers.py"),
            "ensure",
            "--state-dir",
            str(STATE_DIR),
            "--env-file",
            str(env_file),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    values = {}
    for line in env_file.read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            values[name] = value.strip("'\"")
    return values["GIN_DATABASE_URL"], values["GIN_AMQP_URL"]


@pytest.fixture(scope="session")
def server_urls() -> Iterator[tuple[str, str]]:
    """An admin PostgreSQL URL and an AMQP URL for this run."""
    db_url, amqp_url = os.environ.get("GIN_DATABASE_URL"), os.environ.get("GIN_AMQP_URL")
    if db_url and amqp_url:
        yield db_url, amqp_url
    elif _docker_engine_answers():
        from testcontainers.postgres import PostgresContainer
        from testcontainers.rabbitmq import RabbitMqContainer

        # The same pinned releases as the manifests (deploy/k8s/overlays/dev).
        with (
            PostgresContainer("postgres:15.20-bookworm", driver=None) as pg,
            RabbitMqContainer("rabbitmq:4.3.2-management") as mq,
        ):
            host, port = mq.get_container_host_ip(), mq.get_exposed_port(5672)
            yield pg.get_connection_url(), f"amqp://guest:guest@{host}:{port}/"
    else:
        yield _from_servers_script()


@pytest.fixture(scope="session")
def run_id() -> str:
    """A short id naming this run's database and broker prefix."""
    return uuid.uuid4().hex[:10]


def _with_database(url: str, name: str) -> str:
    """The URL of database ``name`` (its path only: a multi-host URL keeps its query)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def database_url(server_urls: tuple[str, str], run_id: str) -> Iterator[str]:
    """This run's own database, dropped at the end."""
    admin = server_urls[0]
    name = f"gin_test_{run_id}"

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    yield _with_database(admin, name)
    asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def settings(database_url: str, server_urls: tuple[str, str], run_id: str) -> Iterator[Settings]:
    """Settings of this run: its database, its broker prefix, short waits."""
    prefix = f"test-{run_id}."

    async def declare() -> None:
        # All of it, as the operator does in production: each service declares only its own
        # part (a table tested without a bot worker still routes its bots' turns to queues).
        connection = await aio_pika.connect(server_urls[1])
        async with connection:
            await amqp.declare_topology(await connection.channel(), prefix)

    asyncio.run(declare())
    yield Settings(
        database_url=database_url,
        amqp_url=server_urls[1],
        prefix=prefix,
        dev_tokens=True,
        bot_think_s=0.0,
        relay_poll_s=0.2,
        log_format="console",
        log_level="warning",
        auth_secret="test-secret-that-is-long-enough-for-hs256",
        # Tests play whole matches as fast as they can: the limits' own tests set them low.
        rate_commands=1_000_000,
        rate_joins=1_000_000,
        rate_tables=1_000_000,
        rate_sockets=1_000_000,
        rate_refusals=1_000_000,
        # The test process is no service: nothing frozen after a full collection (the
        # policy's own test turns it on).
        gc_thaw_s=0.0,
    )

    async def cleanup() -> None:
        connection = await aio_pika.connect(server_urls[1])
        async with connection:
            await amqp.delete_topology(await connection.channel(), prefix)

    asyncio.run(cleanup())


@contextlib.contextmanager
def settings_of_their_own(settings: Settings, suffix: str, **changes: Any) -> Iterator[Settings]:
    """The run's settings with a database and a broker prefix of their own (``suffix``), for
    services that live for a whole session: on the run's database their relay would publish
    the other tests' outbox rows and their consumer take the others' commands. The database
    is made first and dropped, with the prefix's broker objects, at the end."""
    name = urlsplit(settings.database_url).path.lstrip("/")
    own = msgspec.structs.replace(
        settings,
        database_url=_with_database(settings.database_url, f"{name}_{suffix}"),
        prefix=f"{settings.prefix}{suffix}.",
        **changes,
    )

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(settings.database_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def cleanup() -> None:
        await run(f'DROP DATABASE IF EXISTS "{name}_{suffix}" WITH (FORCE)')
        connection = await aio_pika.connect(own.amqp_url)
        async with connection:
            await amqp.delete_topology(await connection.channel(), own.prefix)

    asyncio.run(run(f'CREATE DATABASE "{name}_{suffix}"'))
    try:
        yield own
    finally:
        asyncio.run(cleanup())


# --- the fuzz tests' tally, added up across the workers (tests/fuzz/tally.py) -------------------


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up the time of the fuzz tests, where the reports arrive."""
    if report.nodeid.startswith("tests/fuzz/"):
        tally.SPENT[0] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand the fuzz counts to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["fuzz"] = tally.handed_over()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """In the xdist controller: add up a finished worker's fuzz counts."""
    tally.add(getattr(node, "workeroutput", {}).get("fuzz", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line: how many fuzz cases ran, of which kind, in how long."""
    for line in tally.summary(bool(os.environ.get("GIN_FUZZ_VERBOSE"))):
        terminalreporter.write_line(line)
