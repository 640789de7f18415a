"""``python -m services.timers``: run the timer service (``migrate`` to only migrate)."""

from __future__ import annotations

import asyncio
import sys

import uvloop
from aiohttp import web

from services.timers.app import create_app, migrate
from shared.infra.logs import configure
from shared.infra.settings import Settings


def main() -> None:
    """Run the service until SIGTERM or SIGINT, then drain."""
    settings = Settings.from_env()
    configure(settings.log_format, settings.log_level)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if sys.argv[1:] == ["migrate"]:
        asyncio.run(migrate(settings))
        return
    web.run_app(
        create_app(settings),
        host=settings.http_host,
        port=settings.http_port,
        shutdown_timeout=settings.shutdown_grace_s,
        print=None,
    )


if __name__ == "__main__":
    main()
