"""The real table service against this run's PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aio_pika
import aio_pika.abc
import aiohttp
import asyncpg
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from services.table.app import create_app
from shared.engine import CARDS, parse_card
from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.serving import ProductionServer


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


SHUTDOWN_BOUND_S = 15.0  # a clean shutdown takes well under a second, even on a busy machine


def running_tasks() -> str:
    """Every task of the loop but this one, each with its stack (for a hang's failure)."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            print(f"--- {task!r}", file=out)
            task.print_stack(limit=12, file=out)
    return out.getvalue()


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[TestClient]:
    """A test client of the real app. Its shutdown must end within ``SHUTDOWN_BOUND_S``: a
    hang is the app's bug, and fails the test naming the tasks still running (instead of a
    pytest-timeout with only the event loop's stack)."""
    client = TestClient(ProductionServer(app))
    await client.start_server()
    try:
        yield client
    finally:
        closing = asyncio.create_task(client.close(), name="test-client-close")
        done, _ = await asyncio.wait([closing], timeout=SHUTDOWN_BOUND_S)
        if not done:
            raise AssertionError(
                f"the app's shutdown took over {SHUTDOWN_BOUND_S} s; running:\n{running_tasks()}"
            )
        closing.result()


@pytest.fixture
async def table_client(settings: Settings, clock: Clock) -> AsyncIterator[TestClient]:
    app = create_app(settings, clock=clock, shuffle=SeededShuffle(7))
    async with serving(app) as client:
        yield client


@pytest.fixture
async def api(table_client: TestClient, settings: Settings) -> Api:
    return Api(table_client, settings)


# --- helpers for the table service's integration tests --------------------------------------

CARD_TEXTS: tuple[str, ...] = tuple(str(card) for card in CARDS)
ALL_CARDS: frozenset[str] = frozenset(CARD_TEXTS)
Deal = tuple[list[int], str, int]


def crafted_deck(
    non_dealer: list[str], dealer: list[str], upcard: str, stock: list[str] | tuple[str, ...] = ()
) -> list[int]:
    """A deck that deals these cards (R3.1): deck[0], deck[2], ... to the non-dealer, deck[1],
    deck[3], ... to the dealer, deck[20] face up, then ``stock`` from the top, then the rest of
    the cards in canonical order."""
    assert len(non_dealer) == 10
    assert len(dealer) == 10
    head = [x for pair in zip(non_dealer, dealer, strict=True) for x in pair]
    head += [upcard, *stock]
    cards = [int(parse_card(text)) for text in head]
    assert len(set(cards)) == len(cards), "a card twice in a crafted deck"
    return cards + [card for card in range(52) if card not in cards]


class ScriptedShuffle:
    """Deals the given (deck, salt, lot) first, then seeded ones; remembers every deal."""

    def __init__(self, deals: list[Deal] | None = None, seed: int = 7) -> None:
        self.queue = list(deals or [])
        self.seeded = SeededShuffle(seed)
        self.dealt: list[Deal] = []

    def __call__(self) -> Deal:
        deal = self.queue.pop(0) if self.queue else self.seeded()
        self.dealt.append(deal)
        return deal


@contextlib.asynccontextmanager
async def open_api(
    settings: Settings, clock: Callable[[], float] | None = None, shuffle: Any = None
) -> AsyncIterator[Api]:
    """Another instance of the real app (own clock, shuffle or settings) with its client."""
    app = create_app(
        settings,
        clock=clock or Clock(),
        shuffle=shuffle if shuffle is not None else SeededShuffle(7),
    )
    async with serving(app) as client:
        yield Api(client, settings)


def assert_error(status: int, body: Any, expected_status: int, code: str, rule: str | None) -> None:
    """The one error shape (docs/DESIGN.md section 2) with this status, code and rule."""
    assert status == expected_status, body
    assert isinstance(body, dict)
    assert list(body) == ["error"], body
    assert_error_detail(body["error"], code, rule)


def assert_error_detail(detail: Any, code: str, rule: str | None) -> None:
    """``{"code", "message", "rule"}`` with this code and rule and a message."""
    assert isinstance(detail, dict)
    assert set(detail) == {"code", "message", "rule"}, detail
    assert detail["code"] == code, detail
    assert detail["rule"] == rule, detail
    assert isinstance(detail["message"], str)
    assert detail["message"].strip()


async def all_events(api: Api, table_id: str, after: int = 0) -> list[dict[str, Any]]:
    """The public event log of a table from seq ``after`` + 1, every page."""
    out: list[dict[str, Any]] = []
    while True:
        status, page = await api.call("GET", f"/v1/tables/{table_id}/events?after={after}")
        assert status == 200, page
        if not page:
            return out
        out += page
        after = page[-1]["seq"]


def strings_in(value: Any) -> Iterator[str]:
    """Every string value inside a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


class Tap:
    """A queue of this test's own, bound to one of the run's exchanges; closed on exit."""

    def __init__(self, settings: Settings, exchange: str, *keys: str) -> None:
        self.settings = settings
        self.exchange_name = settings.prefix + exchange
        self.keys = keys
        self.connection: aio_pika.abc.AbstractRobustConnection | None = None
        self.queue: aio_pika.abc.AbstractQueue | None = None

    async def __aenter__(self) -> Tap:
        self.connection = await aio_pika.connect_robust(self.settings.amqp_url)
        channel = await self.connection.channel()
        exchange = await channel.get_exchange(self.exchange_name)
        self.queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        for key in self.keys:
            await self.queue.bind(exchange, key)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.connection is not None
        await self.connection.close()

    async def take(self, wait_s: float = 0.5) -> aio_pika.abc.AbstractIncomingMessage | None:
        """The next message (acknowledged), or None after ``wait_s`` seconds of silence."""
        assert self.queue is not None
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            message = await self.queue.get(fail=False)
            if message is not None:
                await message.ack()
                return message
            if asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(0.02)

    async def collect(self, done: Callable[[list[Any]], bool], within_s: float = 15.0) -> list[Any]:
        """Decoded JSON bodies until ``done(bodies)`` or ``within_s`` seconds have passed."""
        bodies: list[Any] = []
        deadline = asyncio.get_running_loop().time() + within_s
        while not done(bodies) and asyncio.get_running_loop().time() < deadline:
            message = await self.take(0.5)
            if message is not None:
                bodies.append(msgspec.json.decode(message.body))
        return bodies

    async def drain(self, quiet: float = 0.5) -> list[Any]:
        """Every message until the queue has been silent for ``quiet`` seconds."""
        bodies: list[Any] = []
        while (message := await self.take(quiet)) is not None:
            bodies.append(msgspec.json.decode(message.body))
        return bodies


async def ws_receive(ws: Any, within_s: float = 10.0) -> dict[str, Any]:
    """The next JSON message of a WebSocket (fails after ``within_s`` seconds)."""
    msg = await asyncio.wait_for(ws.receive(), within_s)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return msgspec.json.decode(msg.data)  # type: ignore[no-any-return]


async def ws_until(
    ws: Any, done: Callable[[list[dict[str, Any]]], bool], within_s: float = 10.0
) -> list[dict[str, Any]]:
    """WebSocket messages until ``done(messages)``; fails if that takes over ``within_s``."""
    messages: list[dict[str, Any]] = []
    deadline = asyncio.get_running_loop().time() + within_s
    while not done(messages):
        left = deadline - asyncio.get_running_loop().time()
        assert left > 0, f"timed out; got {messages}"
        messages.append(await ws_receive(ws, left))
    return messages


async def play_to_the_end(
    api: Api,
    table_id: str,
    tokens: list[str],
    seed: int,
    on_step: Callable[[int, dict[str, Any], dict[str, Any]], Awaitable[None]] | None = None,
    max_steps: int = 5000,
) -> dict[str, Any]:
    """Both seats play from ``legal`` (never resigning) until the match ends; mostly the
    SOBRA's discard and any knock, so hands end. ``on_step(seat, move, result)`` after each."""
    rng = random.Random(seed)
    view = await api.view(table_id, tokens[0])
    for _ in range(max_steps):
        if view["status"] != "playing":
            return view
        seat = view["hand"]["to_act"] if view["hand"] else view["you"]
        if view["you"] != seat:
            view = await api.view(table_id, tokens[seat])
        moves = [m for m in view["legal"] if m["type"] not in ("resign", "leave", "claim_absence")]
        knocks = [m for m in moves if m["type"] in ("knock", "big_gin")]
        best = view["hand"] and view["hand"]["my_arrangement"].get("discard")
        if knocks:
            move = rng.choice(knocks)
        elif best and rng.random() < 0.8:
            move = {"type": "discard", "card": best}
        else:
            move = rng.choice(moves)
        status, body = await api.command(table_id, tokens[seat], **move)
        assert status == 200, body
        if on_step is not None:
            await on_step(seat, move, body)
        view = body["view"]
    raise AssertionError("the match did not end")


@contextlib.asynccontextmanager
async def connection(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the table service's schema."""
    conn = await asyncpg.connect(
        settings.database_url, server_settings={"search_path": "gin_table"}
    )
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def db(settings: Settings, api: Api) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the table service's schema (the app migrated it)."""
    async with connection(settings) as conn:
        yield conn


async def published(db: asyncpg.Connection, table_id: str, within_s: float = 10.0) -> None:
    """Wait until the relay has published every outbox row of a table's events."""
    deadline = asyncio.get_running_loop().time() + within_s
    while await db.fetchval(
        "SELECT count(*) FROM outbox WHERE published_at IS NULL AND routing_key LIKE $1",
        f"table.{table_id}.%",
    ):
        assert asyncio.get_running_loop().time() < deadline, "the relay did not publish"
        await asyncio.sleep(0.02)


async def ws_silent(ws: Any, quiet_s: float = 0.3) -> None:
    """Fails if the WebSocket sends anything within ``quiet_s`` seconds."""
    try:
        msg = await asyncio.wait_for(ws.receive(), quiet_s)
    except TimeoutError:
        return
    raise AssertionError(f"an unexpected message: {msg}")
