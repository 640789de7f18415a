"""``make dev``: the whole backend on this machine, until Ctrl-C.

Finds (or installs and starts) PostgreSQL and RabbitMQ with ``scripts/servers.py``, makes the
``gin_dev`` database, runs the migrations, then runs every service that exists as a process
with development settings (tokens from ``POST /v1/dev/tokens``) and stops them all on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import servers  # noqa: E402  (a sibling script, not a package)

DEV_DATABASE = "gin_dev"
# (module, port setting, default port): every service that exists runs.
SERVICES = [
    ("services.table", "8080"),
    ("services.chat", "8081"),
    ("services.timers", "8082"),
    ("services.bots", "8083"),
]


async def make_database(admin_url: str, name: str) -> str:
    """Create the development database unless it exists; its URL."""
    conn = await asyncpg.connect(admin_url)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    # path only: a multi-host URL keeps its hosts and its ?target_session_attrs=read-write
    return urlunsplit(urlsplit(admin_url)._replace(path="/" + name))


async def declare_topology(amqp_url: str, prefix: str) -> None:
    """The whole shared topology, as the topology operator declares it in production: each
    service declares only its own part, and the table may publish a bot's turn before the bot
    worker has declared its queue."""
    from aiormq.exceptions import ChannelPreconditionFailed

    from shared.infra import amqp

    connection = await amqp.connect(amqp_url)  # one node, or the first of several that answers
    async with connection:
        try:
            await amqp.declare_topology(await connection.channel(), prefix)
        except ChannelPreconditionFailed as exc:
            # Queues an earlier release declared with other arguments (a classic gin.dead,
            # at-most-once dead-lettering): development's messages are not kept, so they are
            # made again; production moves them as deploy/README.md says.
            print(f"make dev: {exc}; the queues under prefix {prefix!r} are made again")
            await amqp.delete_topology(await connection.channel(), prefix)
            await amqp.declare_topology(await connection.channel(), prefix)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (a supervisor, kill) stops the services as Ctrl-C does


def main() -> int:
    """Run the backend; return when every service has stopped."""
    signal.signal(signal.SIGTERM, _interrupted)
    urls = servers.ensure(ROOT / ".run" / "servers")
    env = dict(os.environ)
    env.update(urls)
    if "GIN_DATABASE_URL" not in os.environ:  # our own database on the server found
        env["GIN_DATABASE_URL"] = asyncio.run(make_database(urls["GIN_DATABASE_URL"], DEV_DATABASE))
    env.setdefault("GIN_DEV_TOKENS", "1")
    env.setdefault("GIN_LOG_FORMAT", "console")
    asyncio.run(declare_topology(env["GIN_AMQP_URL"], env.get("GIN_PREFIX", "")))
    procs: list[subprocess.Popen[bytes]] = []
    for module, port in SERVICES:
        if importlib.util.find_spec(module) is None:
            continue
        service_env = dict(
            env, GIN_HTTP_PORT=env.get(f"GIN_{module.split('.')[1].upper()}_PORT", port)
        )
        procs.append(subprocess.Popen([sys.executable, "-m", module], env=service_env, cwd=ROOT))
    time.sleep(1.5)
    print(
        "\nSelminha Gin is running:\n"
        "  table service  http://127.0.0.1:8080   chat :8081   timers :8082   bots :8083\n"
        "  play:          open http://127.0.0.1:8080/ in a browser\n"
        '  a token:       curl -s -XPOST localhost:8080/v1/dev/tokens -d \'{"name": "Ana"}\'\n'
        "  a table:       curl -s -XPOST localhost:8080/v1/tables \\\n"
        "                   -H 'Authorization: Bearer TOKEN'\n"
        "  Ctrl-C stops everything.\n",
        flush=True,
    )
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    failed = [p.args for p in procs if p.returncode not in (0, -signal.SIGTERM, None)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
