"""The real table service against this run's PostgreSQL and RabbitMQ."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.table.app import create_app
from shared.infra.auth import mint
from shared.infra.settings import Settings


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SeededShuffle:
    """Deals from a seeded generator, so a test's hands replay (R3.5)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self) -> tuple[list[int], str, int]:
        deck = list(range(52))
        self.rng.shuffle(deck)
        return deck, f"{self.rng.getrandbits(64):016x}", self.rng.randrange(2)


class Api:
    """A thin client of the v1 API for tests: returns (status, json)."""

    def __init__(self, client: TestClient, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.n = 0

    def token(self, name: str, sub: str | None = None) -> str:
        self.n += 1
        return mint(self.settings.auth_secret, sub or f"user-{self.n}-{name}", name)

    @staticmethod
    def auth(token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        body: Any = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else msgspec.json.encode(body))
        async with self.client.request(method, path, data=data, headers=self.auth(token)) as r:
            text = await r.read()
            return r.status, (msgspec.json.decode(text) if text else None)

    async def create(self, token: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        status, body = await self.call("POST", "/v1/tables", token, {"options": options or {}})
        assert status == 201, body
        return body  # type: ignore[no-any-return]

    async def table_for_two(self, options: dict[str, Any] | None = None) -> tuple[str, str, str]:
        """A table with two people seated: (table_id, creator token, joiner token)."""
        a, b = self.token("Ana"), self.token("Bia")
        created = await self.create(a, options)
        status, body = await self.call(
            "POST",
            f"/v1/tables/{created['table_id']}/join",
            b,
            {"invite_code": created["invite_code"]},
        )
        assert status == 200, body
        return created["table_id"], a, b

    async def view(self, table_id: str, token: str | None = None) -> dict[str, Any]:
        status, body = await self.call("GET", f"/v1/tables/{table_id}", token)
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    async def command(self, table_id: str, token: str, **command: Any) -> tuple[int, Any]:
        return await self.call("POST", f"/v1/tables/{table_id}/commands", token, command)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def table_client(settings: Settings, clock: Clock) -> AsyncIterator[TestClient]:
    app = create_app(settings, clock=clock, shuffle=SeededShuffle(7))
    async with TestClient(TestServer(app)) as client:
        yield client


@pytest.fixture
async def api(table_client: TestClient, settings: Settings) -> Api:
    return Api(table_client, settings)
