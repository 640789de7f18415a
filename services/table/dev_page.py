"""The reference client (``web/``), served by the table service in development only.

The page is plain HTML, CSS and ES modules: no build step. It uses only the public v1 API, so
it is served from the table service's own origin (the WebSocket and the HTTP routes are then
same-origin). ``create_app`` adds these routes only when development tokens are on
(``GIN_DEV_TOKENS``): production serves no page, and ``/`` answers 404 there. An installed
wheel carries no ``web/`` folder, so nothing is served without one either.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

WEB_ROOT = Path(__file__).resolve().parents[2] / "web"
# The page changes while a developer works on it: the browser asks again every time.
NO_CACHE = {"Cache-Control": "no-cache"}
PAGE = "dev-page"  # the routes' names start with it


def add_dev_page(app: web.Application, root: Path = WEB_ROOT) -> None:
    """``/`` and ``/tables/{table}`` (the invitation link's path) answer the page; its files
    are under ``/web/``. Nothing is added when ``root`` has no ``index.html``."""
    index = root / "index.html"
    if not index.is_file():
        return
    files = root.resolve()

    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(index, headers=NO_CACHE)

    async def asset(request: web.Request) -> web.FileResponse:
        path = (files / request.match_info["path"]).resolve()
        if not path.is_relative_to(files) or not path.is_file():
            raise web.HTTPNotFound()
        return web.FileResponse(path, headers=NO_CACHE)

    app.router.add_get("/", page, name=f"{PAGE}-index")
    app.router.add_get("/tables/{table}", page, name=f"{PAGE}-table")
    app.router.add_get("/web/{path:.+}", asset, name=f"{PAGE}-file")


def is_page_route(route: web.AbstractRoute) -> bool:
    """Whether ``route`` serves the page: no part of the v1 API (nor of docs/openapi.yaml)."""
    name = route.name or ""
    return name.startswith(f"{PAGE}-")
