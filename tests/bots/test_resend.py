"""No lost turn (issue 14, part 2): a bot turn that got no move within ``bot_turn_resend_s`` is
sent again, and the bot moves once. Real table service, real bot worker, real RabbitMQ; the
table's clock is moved by hand past the resend time."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import aio_pika
import asyncpg
import msgspec
import pytest
from aiohttp.test_utils import TestClient

from services.bots.app import create_app as create_worker
from services.bots.strategies import STRATEGIES
from shared.contracts import commands as c
from shared.contracts.api import BotTurn
from shared.contracts.names import bot_queue
from shared.contracts.views import TableView
from shared.infra.settings import Settings
from tests.bots.test_worker import LEVEL, bot_table, persons_turn, purge, wait_for
from tests.e2e.processes import ROOT
from tests.serving import ProductionServer
from tests.table.conftest import Api, Clock, open_api

RESEND_S = 1.0


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, bot_turn_resend_s=RESEND_S)


@pytest.fixture
async def table(fast: Settings, clock: Clock) -> AsyncIterator[Api]:
    async with open_api(fast, clock=clock) as api:
        await purge(fast)
        yield api


async def bots_turn(api: Api) -> tuple[str, str, int]:
    """A table where the bot has a decision: (table id, the person's token, version)."""
    table_id, token = await bot_table(api)
    view = await api.view(table_id, token)
    if view["hand"]["to_act"] == 0:  # the person passes: the bot decides next
        status, body = await api.command(table_id, token, type="pass_upcard")
        assert status == 200, body
        view = await api.view(table_id, token)
    assert view["hand"]["to_act"] == 1
    return table_id, token, view["version"]


async def take_turn(settings: Settings, table_id: str) -> aio_pika.abc.AbstractIncomingMessage:
    """The next bot turn of the table from the bot's queue (acknowledged: it is gone)."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(settings.prefix + bot_queue(LEVEL))
        async with asyncio.timeout(10):
            while True:
                message = await queue.get(fail=False)
                if message is None:
                    await asyncio.sleep(0.05)
                    continue
                await message.ack()
                if msgspec.json.decode(message.body, type=BotTurn).table_id == table_id:
                    return message


async def resent_count(api: Api) -> float:
    async with api.client.get("/metrics") as response:
        assert response.status == 200
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("gin_bot_turns_resent_total "):
            return float(line.split()[1])
    raise AssertionError("no gin_bot_turns_resent_total")


async def bot_moves(api: Api, table_id: str) -> list[dict]:
    status, events = await api.call("GET", f"/v1/tables/{table_id}/events?after=0")
    assert status == 200
    return [e for e in events if e["data"]["type"] in ("upcard_taken", "upcard_passed")]


async def test_a_dropped_turn_is_sent_again_and_the_bot_moves_once(
    table: Api, fast: Settings, clock: Clock
) -> None:
    table_id, token, version = await bots_turn(table)
    dropped = await take_turn(fast, table_id)  # lost: no worker will ever see it
    assert msgspec.json.decode(dropped.body, type=BotTurn).version == version
    before = await resent_count(table)
    app = create_worker(fast, {LEVEL: STRATEGIES[LEVEL]})
    async with TestClient(ProductionServer(app)):
        await asyncio.sleep(3 * RESEND_S)  # the table's clock stands still: not due yet
        assert (await table.view(table_id, token))["version"] == version
        assert await resent_count(table) == before
        clock.advance(RESEND_S + 0.5)
        await wait_for(table, table_id, token, persons_turn, seconds=15)
        # the original turn turns up after all (a broker gave it back): no second move
        connection = await aio_pika.connect(fast.amqp_url)
        async with connection:
            channel = await connection.channel()
            await channel.default_exchange.publish(
                aio_pika.Message(dropped.body), routing_key=fast.prefix + bot_queue(LEVEL)
            )
        await asyncio.sleep(1.0)
    assert await resent_count(table) == before + 1
    decisions = [e for e in await bot_moves(table, table_id) if e["data"]["seat"] == 1]
    assert len(decisions) == 1


async def test_a_turn_rejected_once_by_the_worker_is_sent_again(
    table: Api, fast: Settings, clock: Clock
) -> None:
    failures: list[int] = []

    def fails_once(view: TableView, rng: random.Random) -> c.Command:
        if not failures:
            failures.append(view.version)
            raise RuntimeError("a bug in the strategy, once")  # dead-lettered
        return STRATEGIES[LEVEL](view, rng)

    table_id, token, version = await bots_turn(table)
    app = create_worker(fast, {LEVEL: fails_once})
    async with TestClient(ProductionServer(app)):
        async with asyncio.timeout(10):
            while not failures:
                await asyncio.sleep(0.05)
        assert failures == [version]
        await asyncio.sleep(2 * RESEND_S)
        assert (await table.view(table_id, token))["version"] == version  # stuck, for now
        clock.advance(RESEND_S + 0.5)
        view = await wait_for(table, table_id, token, persons_turn, seconds=15)
    assert view["version"] > version


async def test_resends_double_their_interval_until_a_move_comes(
    table: Api, fast: Settings, clock: Clock
) -> None:
    table_id, _, version = await bots_turn(table)
    await take_turn(fast, table_id)  # the first is lost; no worker runs
    before = await resent_count(table)
    resent_at: list[int] = []
    for second in range(1, 13):  # 12 s of the table's clock, a second at a time
        clock.advance(1.0)
        if second in (1, 2, 4, 8):  # due after 1 s, then as long again as it has waited
            async with asyncio.timeout(5):
                while await resent_count(table) == before + len(resent_at):
                    await asyncio.sleep(0.05)
            resent_at.append(second)
        else:
            await asyncio.sleep(0.4)  # the loop looks every RESEND_S / 6: it would have
        assert await resent_count(table) == before + len(resent_at), second
    assert resent_at == [1, 2, 4, 8]
    turns = [msgspec.json.decode(m.body, type=BotTurn) for m in await drain(fast)]
    assert [(t.table_id, t.version) for t in turns] == [(table_id, version)] * 4


async def drain(settings: Settings) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message waiting in the bot's queue."""
    connection = await aio_pika.connect(settings.amqp_url)
    taken = []
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(settings.prefix + bot_queue(LEVEL))
        while (message := await queue.get(fail=False)) is not None:
            await message.ack()
            taken.append(message)
    return taken


async def test_a_match_playing_before_the_due_column_existed_is_looked_at_once(
    table: Api, fast: Settings, clock: Clock
) -> None:
    """Migration 007: a bot's pending turn with no due time (written before 005) is sent again;
    a table where the person is to act only has its due time cleared."""
    waiting, _, version = await bots_turn(table)  # the bot is to act
    await take_turn(fast, waiting)  # and its turn was lost
    person, token = await bot_table(table)
    if (await table.view(person, token))["hand"]["to_act"] == 1:
        await take_turn(fast, person)
        app = create_worker(fast, {LEVEL: STRATEGIES[LEVEL]})
        async with TestClient(ProductionServer(app)):
            await wait_for(table, person, token, persons_turn)
    await drain(fast)
    sql = (ROOT / "services/table/migrations/007_bot_turn_due_backfill.sql").read_text()
    conn = await asyncpg.connect(fast.database_url, server_settings={"search_path": "gin_table"})
    try:
        await conn.execute(
            "UPDATE tables SET bot_turn_due_at = NULL WHERE table_id = ANY($1)", [waiting, person]
        )
        await conn.execute(sql)
        before = await resent_count(table)
        async with asyncio.timeout(10):
            while await conn.fetchval(
                "SELECT count(*) FROM tables WHERE table_id = ANY($1) AND bot_turn_due_at <= now()",
                [waiting, person],
            ):
                await asyncio.sleep(0.05)
        due = dict(
            await conn.fetch(
                "SELECT table_id, bot_turn_due_at IS NOT NULL FROM tables WHERE table_id = ANY($1)",
                [waiting, person],
            )
        )
    finally:
        await conn.close()
    assert due == {waiting: True, person: False}  # resent (due again later), and cleared
    assert await resent_count(table) == before + 1
    turns = [msgspec.json.decode(m.body, type=BotTurn) for m in await drain(fast)]
    assert [(t.table_id, t.version) for t in turns] == [(waiting, version)]
