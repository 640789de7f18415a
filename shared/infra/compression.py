"""Long answers gzipped for the clients that accept it.

The site is played mostly on phones. A page opening a table reads its event log (``GET
.../events``, up to a thousand events a page), a lobby its list of tables: JSON that gzip
makes several times smaller. The edge (ingress-nginx) compresses only if its controller's
ConfigMap says so, and this repository does not own that ConfigMap; so the services compress
the long answers, as they do their sockets' frames (``services/table/deflate.py``).

Only a ``web.Response`` whose whole body is known, not yet encoded, and at least
``MIN_BYTES`` long. zlib's level 1, not aiohttp's own compression (level 6, not settable):
JSON shrinks nearly as much for under half the CPU. A body past ``THREAD_BYTES`` is
compressed on a thread (zlib releases the GIL). gzip, not deflate: ``Content-Encoding:
deflate`` has been read both as zlib and as raw deflate by clients.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from shared.infra.settings import Settings

# Answers shorter than this go plain: a command's answer or a view (a few KB) fits in the
# first flight of a connection's packets compressed or not, and gzipping each move's answer
# cost the table a tenth of its moves at saturation (docs/DESIGN.md §8). A page of a log, a
# long list, a hand's record or a chat's history is gzipped.
MIN_BYTES = 8 * 1024
LEVEL = 1
GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream
# A body this long is compressed on a thread, not on the event loop.
THREAD_BYTES = 16 * 1024


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value accepts gzip (by name or ``*``, not with q=0)."""
    named: float | None = None
    star: float | None = None
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.partition(";")
        q = _quality(params)
        if coding.strip() in ("gzip", "x-gzip"):
            named = q if named is None else max(named, q)
        elif coding.strip() == "*":
            star = q
    weight = named if named is not None else star
    return weight is not None and weight > 0


def _quality(params: str) -> float:
    """The ``q`` of a coding's parameters (1 without one; 0 for one that is not a number)."""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 0.0
    return 1.0


@web.middleware
async def gzip_large_answers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The outermost middleware: the final answer (a refusal's too) is gzipped if it is
    worth it and the client accepts gzip; every answer that could be says ``Vary``."""
    response = await handler(request)
    if (
        isinstance(response, web.Response)
        and not response.prepared
        and isinstance(response.body, bytes)
        and len(response.body) >= MIN_BYTES
        and hdrs.CONTENT_ENCODING not in response.headers
    ):
        response.headers.add(hdrs.VARY, hdrs.ACCEPT_ENCODING)
        if accepts_gzip(request.headers.get(hdrs.ACCEPT_ENCODING, "")):
            response.body = await gzipped(response.body)
            response.headers[hdrs.CONTENT_ENCODING] = "gzip"
    return response


async def gzipped(body: bytes) -> bytes:
    """``body`` in gzip at ``LEVEL``; on a thread if it is long."""
    if len(body) < THREAD_BYTES:
        return zlib.compress(body, LEVEL, GZIP_WBITS)
    return await asyncio.get_running_loop().run_in_executor(
        None, zlib.compress, body, LEVEL, GZIP_WBITS
    )


def answer_compression(settings: Settings) -> list[Middleware]:
    """The middleware to put first in an app's list, unless ``GIN_HTTP_GZIP`` is off."""
    return [gzip_large_answers] if settings.http_gzip else []
