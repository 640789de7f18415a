"""``python -m services.chat``: run the chat service (``migrate`` to only migrate).

It answers on ``GIN_HTTP_PORT``, or on 8081 when that is not set (DESIGN.md section 6: the
table service has 8080).
"""

from __future__ import annotations

import asyncio
import os
import sys

import msgspec
import uvloop
from aiohttp import web

from services.chat.app import create_app, migrate
from shared.infra.logs import configure
from shared.infra.settings import Settings, env_name

DEFAULT_PORT = 8081


def main() -> None:
    """Run the service until SIGTERM or SIGINT, then drain."""
    settings = Settings.from_env()
    if env_name("http_port") not in os.environ:
        settings = msgspec.structs.replace(settings, http_port=DEFAULT_PORT)
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
