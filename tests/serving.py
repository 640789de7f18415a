"""The apps under test served as production serves them."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestServer
from aiohttp.web_runner import BaseRunner

from shared.infra.serving import KEEPALIVE_S, Runner


class ProductionServer(TestServer):
    """aiohttp's TestServer, but through ``service.main``'s runner (``serving.Runner``: the
    head deadline, the keep-alive), and with the handler of a client that went away left to
    run, as in production: aiohttp's own cancels it, which hides what a departed client
    leaves behind (a held refusal, a command half done)."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return Runner(
            self.app,
            **{**kwargs, "handler_cancellation": False, "keepalive_timeout": KEEPALIVE_S},
        )
