"""CORS for the development page: the reference client (``web/``) is served by the table
service (port 8080) and writes to the chat service (port 8081), another origin.

Only with development tokens on (``GIN_DEV_TOKENS``), and only for the origin the table
service is reached at (``GIN_PUBLIC_URL``, with ``localhost`` and ``127.0.0.1`` taken as one):
production answers no preflight and sends no CORS header. The tokens are bearer tokens, never
cookies, so no credentials are allowed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web

LOOPBACK = ("127.0.0.1", "localhost")


def dev_origins(public_url: str) -> frozenset[str]:
    """The page's origins: the public URL's, and its twin on the other loopback name.

    >>> sorted(dev_origins("http://127.0.0.1:8080/"))
    ['http://127.0.0.1:8080', 'http://localhost:8080']
    """
    parts = urlsplit(public_url)
    host, port = parts.hostname or "", f":{parts.port}" if parts.port else ""
    hosts = LOOPBACK if host in LOOPBACK else (host,)
    return frozenset(f"{parts.scheme}://{h}{port}" for h in hosts)


def allow_dev_page(app: web.Application, public_url: str) -> None:
    """Answer the page's preflight for the messages route, and let it read every answer."""
    origins = dev_origins(public_url)

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin not in origins:
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "Retry-After"
        response.headers["Vary"] = "Origin"
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Methods"] = "GET, POST"
            allowed = "Authorization, Content-Type, Accept-Language"
            response.headers["Access-Control-Allow-Headers"] = allowed
            response.headers["Access-Control-Max-Age"] = "600"

    app.router.add_route("OPTIONS", "/v1/tables/{id}/messages", preflight)
    app.on_response_prepare.append(headers)
