"""The bot worker against real RabbitMQ and the real table service (issue 4)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import msgspec
import pytest
from aiohttp.test_utils import TestClient

from services.bots.app import create_app as create_worker
from services.bots.strategies import STRATEGIES
from shared.contracts.api import BotTurn
from shared.contracts.commands import Command
from shared.contracts.names import DEAD_LETTER, bot_queue
from shared.contracts.views import TableView
from shared.infra.settings import Settings
from tests.moves import sobra_move
from tests.serving import ProductionServer
from tests.table.conftest import Api

LEVEL = "carmen"  # a queue no other test seats a bot on


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[TestClient]:
    app = create_worker(settings, {LEVEL: STRATEGIES[LEVEL]})
    async with TestClient(ProductionServer(app)) as client:
        yield client


async def bot_table(api: Api, options: dict[str, Any] | None = None) -> tuple[str, str]:
    token = api.token("Ana")
    created = await api.create(token, options)
    status, body = await api.call(
        "POST", f"/v1/tables/{created['table_id']}/bot", token, {"level": LEVEL}
    )
    assert status == 200, body
    return created["table_id"], token


async def wait_for(api: Api, table_id: str, token: str, done: Any, seconds: float = 20) -> dict:
    """Poll the person's view until ``done(view)``."""
    async with asyncio.timeout(seconds):
        while True:
            view = await api.view(table_id, token)
            if done(view):
                return view
            await asyncio.sleep(0.05)


def persons_turn(view: dict) -> bool:
    hand = view["hand"]
    return view["status"] != "playing" or (hand is not None and hand["to_act"] == 0)


async def purge(settings: Settings) -> None:
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        for name in (bot_queue(LEVEL), DEAD_LETTER):
            queue = await channel.declare_queue(settings.prefix + name, passive=True)
            await queue.purge()


async def test_a_bot_plays_a_whole_match_against_a_scripted_player(
    api: Api, worker: TestClient, settings: Settings
) -> None:
    await purge(settings)
    table_id, token = await bot_table(api, {"target": 25})
    moves = 0
    while True:
        view = await wait_for(api, table_id, token, persons_turn)
        if view["status"] != "playing":
            break
        # The scripted person: pass the upcard, draw from the stock, discard the SOBRA's pick.
        move = sobra_move(view)
        status, body = await api.command(table_id, token, **move)
        assert status == 200, body
        moves += 1
        assert moves < 2000
    assert view["status"] == "match_over"
    result = view["match"]["result"]
    assert result["reason"] == "target"
    events = await api.call("GET", f"/v1/tables/{table_id}/events?after=0")
    types = [e["data"]["type"] for e in events[1]]
    bot_moves = [
        e for e in events[1] if e["data"].get("seat") == 1 and e["data"]["type"] != "seat_taken"
    ]
    assert bot_moves, "the bot never moved"
    assert types.count("hand_ended") >= 1


async def test_the_same_turn_delivered_twice_makes_one_move(api: Api, settings: Settings) -> None:
    await purge(settings)
    # No worker yet: the turns wait in the bot's queue.
    table_id, token = await bot_table(api)
    view = await api.view(table_id, token)
    if view["hand"]["to_act"] == 0:  # the person passes, so the bot has a decision
        status, _ = await api.command(table_id, token, type="pass_upcard")
        assert status == 200
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(settings.prefix + bot_queue(LEVEL), passive=True)
        async with asyncio.timeout(10):
            while (message := await queue.get(fail=False)) is None:
                await asyncio.sleep(0.05)
        turn = msgspec.json.decode(message.body, type=BotTurn)
        assert turn.table_id == table_id
        await message.ack()
        for _ in range(2):  # a redelivery: the very same turn twice
            await channel.default_exchange.publish(
                aio_pika.Message(message.body), routing_key=settings.prefix + bot_queue(LEVEL)
            )
    before = await api.view(table_id, token)
    app = create_worker(settings, {LEVEL: STRATEGIES[LEVEL]})
    async with TestClient(ProductionServer(app)):
        settled = await wait_for(api, table_id, token, persons_turn)
        await asyncio.sleep(1.0)  # time for the copy to be handled too
        assert (await api.view(table_id, token))["version"] == settled["version"]
    status, events = await api.call("GET", f"/v1/tables/{table_id}/events?after=0")
    assert status == 200
    upcard_decisions = [
        e
        for e in events
        if e["data"]["type"] in ("upcard_taken", "upcard_passed") and e["data"]["seat"] == turn.seat
    ]
    assert len(upcard_decisions) == 1  # the turn was delivered twice, decided once
    # Taking the upcard is followed by the bot's discard (a new turn); passing is all.
    took = upcard_decisions[0]["data"]["type"] == "upcard_taken"
    assert settled["version"] == before["version"] + (2 if took else 1)


async def test_a_poison_turn_is_dead_lettered_and_does_not_block_the_queue(
    api: Api, worker: TestClient, settings: Settings
) -> None:
    await purge(settings)
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"not": "a turn"}'), routing_key=settings.prefix + bot_queue(LEVEL)
        )
        table_id, token = await bot_table(api)
        view = await api.view(table_id, token)
        if view["hand"]["to_act"] == 0:
            status, _ = await api.command(table_id, token, type="pass_upcard")
            assert status == 200
        moved = await wait_for(api, table_id, token, persons_turn)
        assert moved["version"] > view["version"]  # the bot answered after the poison
        dead = await channel.declare_queue(settings.prefix + DEAD_LETTER, passive=True)
        async with asyncio.timeout(10):
            while (message := await dead.get(fail=False)) is None:
                await asyncio.sleep(0.05)
        assert message.body == b'{"not": "a turn"}'
        await message.ack()


async def test_a_person_who_sends_the_bots_next_command_id_does_not_freeze_it(
    api: Api, worker: TestClient, settings: Settings
) -> None:
    """Command ids are scoped by who sends them: a person may send the very id the bot will
    use next (``bot:<table>:<version>:<seat>`` is predictable), and the bot still moves."""
    await purge(settings)
    table_id, token = await bot_table(api)
    for _ in range(3):  # three turns of the bot, each after a squatted id
        view = await wait_for(api, table_id, token, persons_turn)
        move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw"))
        if move["type"] == "draw":
            move = {"type": "draw", "source": "stock"}
            status, body = await api.command(table_id, token, **move)
            assert status == 200, body
            view = body["view"]
            move = {"type": "discard", "card": view["hand"]["my_cards"][0]}
        # The bot's turn comes at the version this move makes: squat that turn's id.
        squatted = f"bot:{table_id}:{view['version'] + 1}:1"
        status, body = await api.command(table_id, token, command_id=squatted, **move)
        assert status == 200, body
        assert squatted == f"bot:{table_id}:{body['version']}:1"  # the id of the bot's turn
        if body["view"]["hand"] is None or body["view"]["hand"]["to_act"] != 1:
            continue  # the hand ended on this move: the bot has no turn to squat
        moved = await wait_for(api, table_id, token, persons_turn)
        assert moved["version"] > body["version"], "the bot did not move"


async def test_a_decision_in_progress_leaves_the_worker_answering(
    api: Api, settings: Settings
) -> None:
    """A decision is CPU work off the event loop: while one runs, the worker still answers its
    health probes (here the decision waits until a probe has been answered)."""
    await purge(settings)
    started = threading.Event()
    released = threading.Event()
    waited: list[bool] = []

    def slow(view: TableView, rng: random.Random) -> Command:
        started.set()
        # On the event loop this would wait out its timeout: no probe can be answered.
        waited.append(released.wait(timeout=10))
        return STRATEGIES[LEVEL](view, rng)

    app = create_worker(settings, {LEVEL: slow})
    async with TestClient(ProductionServer(app)) as worker:
        table_id, token = await bot_table(api)
        view = await api.view(table_id, token)
        if view["hand"]["to_act"] == 0:  # the person passes, so the bot has a decision
            status, _ = await api.command(table_id, token, type="pass_upcard")
            assert status == 200
        assert await asyncio.to_thread(started.wait, 20), "the bot never took its turn"
        probe = await worker.get("/readyz")
        assert probe.status == 200, await probe.text()
        released.set()
        moved = await wait_for(api, table_id, token, persons_turn)
    assert waited[0], "the probe was answered only after the decision gave up waiting"
    assert moved["version"] > view["version"]
