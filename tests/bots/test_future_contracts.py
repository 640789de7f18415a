"""A rolling deploy that adds command types and fields dead-letters nothing (issue 15, part 2).

A bot turn as a newer table service would send it (new command types in ``legal``, new fields
in its commands and in the turn) is decided as today; on ``gin.commands`` a command of a newer
type is acknowledged and skipped and a known one with new fields is applied. Against the real
table service, bot worker and RabbitMQ; the dead-letter queue stays empty.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import msgspec
from aiohttp.test_utils import TestClient

from services.bots.app import create_app as create_worker
from services.bots.strategies import STRATEGIES
from shared.contracts.names import COMMANDS_QUEUE, DEAD_LETTER, bot_queue
from shared.infra.settings import Settings
from tests.bots.test_worker import LEVEL, bot_table, persons_turn, purge, wait_for
from tests.serving import ProductionServer
from tests.table.conftest import Api


def future_turn(body: bytes) -> bytes:
    turn: dict[str, Any] = msgspec.json.decode(body)
    view = turn["view"]
    view["legal"] = [
        {"type": "juggle", "cards": ["Ks", "Qs"]},
        *({**entry, "flourish": True} for entry in view["legal"]),
    ]
    view["mood"] = "cheerful"
    turn["priority"] = "high"
    return msgspec.json.encode(turn)


async def dead_letters(channel: aio_pika.abc.AbstractChannel, settings: Settings) -> int:
    queue = await channel.declare_queue(settings.prefix + DEAD_LETTER, passive=True)
    count: int = queue.declaration_result.message_count
    return count


async def test_a_turn_of_a_newer_contract_is_decided(api: Api, settings: Settings) -> None:
    await purge(settings)
    table_id, token = await bot_table(api)  # no worker yet: the turn waits in its queue
    view = await api.view(table_id, token)
    if view["hand"]["to_act"] == 0:
        status, _ = await api.command(table_id, token, type="pass_upcard")
        assert status == 200
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(settings.prefix + bot_queue(LEVEL), passive=True)
        async with asyncio.timeout(10):
            while (message := await queue.get(fail=False)) is None:
                await asyncio.sleep(0.05)
        await message.ack()
        await channel.default_exchange.publish(
            aio_pika.Message(future_turn(message.body)),
            routing_key=settings.prefix + bot_queue(LEVEL),
        )
        before = await api.view(table_id, token)
        app = create_worker(settings, {LEVEL: STRATEGIES[LEVEL]})
        async with TestClient(ProductionServer(app)):
            moved = await wait_for(api, table_id, token, persons_turn)
        assert moved["version"] > before["version"]  # the bot moved on the future turn
        assert await dead_letters(channel, settings) == 0


async def test_queued_commands_of_a_newer_contract(api: Api, settings: Settings) -> None:
    """An unknown command type is skipped; a known one with new fields is applied."""
    await purge(settings)
    table_id, token = await bot_table(api)
    view = await api.view(table_id, token)
    if view["hand"]["to_act"] == 0:
        status, _ = await api.command(table_id, token, type="pass_upcard")
        assert status == 200
        view = await api.view(table_id, token)
    bot_seat = view["hand"]["to_act"]
    assert bot_seat == 1
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        turns = await channel.declare_queue(settings.prefix + bot_queue(LEVEL), passive=True)
        await turns.purge()  # this test moves for the bot itself
        for command in (
            {"type": "juggle", "command_id": f"bot:{table_id}:x", "cards": ["Ks"]},
            {
                "type": "pass_upcard",
                "command_id": f"bot:{table_id}:{view['version']}:1",
                "expected_version": view["version"],
                "with_a_sigh": True,
            },
        ):
            body = {
                "table_id": table_id,
                "source": "bot",
                "seat": bot_seat,
                "command": command,
                "sent_by": "a newer bot worker",
            }
            await channel.default_exchange.publish(
                aio_pika.Message(msgspec.json.encode(body)),
                routing_key=settings.prefix + COMMANDS_QUEUE,
            )
        moved = await wait_for(api, table_id, token, lambda v: v["version"] > view["version"])
        assert moved["version"] == view["version"] + 1  # the pass, once; the juggle, nothing
        status, events = await api.call("GET", f"/v1/tables/{table_id}/events?after=0")
        assert status == 200
        assert [e["type"] for e in events][-1] in ("upcard_passed", "hand_started")
        await asyncio.sleep(0.5)
        assert await dead_letters(channel, settings) == 0
