"""The apps under test served as production serves them."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.web_runner import BaseRunner


class ProductionServer(TestServer):
    """aiohttp's TestServer, but with the handler of a client that went away left to run, as
    ``web.run_app`` (``service.main``) does in production: aiohttp's own cancels it, which
    hides what a departed client leaves behind (a held refusal, a command half done)."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return web.AppRunner(self.app, **{**kwargs, "handler_cancellation": False})
