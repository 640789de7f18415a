"""``python -m services.bots``: run a bot worker (TITO, CARMEN and LUNA) until SIGTERM."""

from __future__ import annotations

import asyncio

import uvloop
from aiohttp import web

from services.bots.app import create_app
from shared.infra.logs import configure
from shared.infra.settings import Settings


def main() -> None:
    """Run the worker and its health routes."""
    settings = Settings.from_env()
    configure(settings.log_format, settings.log_level)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(
        create_app(settings),
        host=settings.http_host,
        port=settings.http_port,
        shutdown_timeout=settings.shutdown_grace_s,
        print=None,
    )


if __name__ == "__main__":
    main()
