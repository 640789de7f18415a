"""The page is served in development only; the chat answers its origin's CORS only then."""

from __future__ import annotations

import doctest

import msgspec
from aiohttp.test_utils import TestClient

from services.chat import dev_cors
from services.chat.app import create_app as create_chat
from shared.infra.settings import Settings
from tests.table.conftest import open_api, serving

PAGE_PATHS = ("/", "/tables/abc123", "/web/app.js", "/web/style.css")


async def test_production_serves_no_page(settings: Settings) -> None:
    production = msgspec.structs.replace(settings, dev_tokens=False)
    async with open_api(production) as api:
        for path in PAGE_PATHS:
            async with api.client.get(path) as r:
                assert r.status == 404, path
                assert (await r.json())["error"]["code"] == "no_such_route"


async def test_development_serves_the_page_and_only_its_files(settings: Settings) -> None:
    assert settings.dev_tokens
    async with open_api(settings) as api:
        for path in ("/", "/tables/abc123"):
            async with api.client.get(path) as r:
                assert r.status == 200, path
                assert r.content_type == "text/html"
                assert '<script type="module" src="/web/app.js">' in await r.text()
        async with api.client.get("/web/app.js") as r:
            assert r.status == 200
            assert "javascript" in r.content_type
            assert r.headers["Cache-Control"] == "no-cache"
        for outside in ("/web/%2e%2e/pyproject.toml", "/web/..%2fMakefile", "/web/nothing.js"):
            async with api.client.get(outside) as r:
                assert r.status == 404, outside


async def _preflight(client: TestClient, origin: str) -> tuple[int, str | None]:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    async with client.options("/v1/tables/abc123/messages", headers=headers) as r:
        return r.status, r.headers.get("Access-Control-Allow-Origin")


async def test_the_chat_answers_the_page_origin_in_development_only(settings: Settings) -> None:
    page = "http://127.0.0.1:8080"
    dev = msgspec.structs.replace(settings, public_url=page)
    async with serving(create_chat(dev)) as client:
        assert await _preflight(client, page) == (204, page)
        assert await _preflight(client, "http://localhost:8080") == (204, "http://localhost:8080")
        assert await _preflight(client, "http://evil.example") == (204, None)
        async with client.get("/v1/tables/abc123/messages", headers={"Origin": page}) as r:
            assert r.headers["Access-Control-Allow-Origin"] == page  # a refusal too
    production = msgspec.structs.replace(dev, dev_tokens=False)
    async with serving(create_chat(production)) as client:
        status, allowed = await _preflight(client, page)
        assert (status, allowed) == (405, None)


def test_dev_origins_doctest() -> None:
    assert doctest.testmod(dev_cors).failed == 0
