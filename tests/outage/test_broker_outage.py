"""RabbitMQ stopped for 20 s mid-match: no command fails, and no event is lost once it is back.

Runs against a throwaway RabbitMQ node of its own (``scripts/servers.py``), whose AMQP
listener is stopped and started with ``rabbitmqctl stop_app`` / ``start_app``, so the shared
broker is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import asyncpg
import msgspec
import pytest
from aiohttp.test_utils import TestClient

from services.table.app import create_app
from shared.contracts.envelope import envelope_decoder
from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra.settings import Settings
from tests.serving import ProductionServer
from tests.table.conftest import Api, Clock, SeededShuffle

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import servers  # noqa: E402

OUTAGE_S = 20.0
pytestmark = pytest.mark.slow


class Node:
    """A throwaway RabbitMQ node whose application the test stops and starts."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.entry = servers.start_rabbitmq(
            state_dir, servers.load_state(state_dir), servers.Installer(), 180
        )
        self.owner = servers.owner_of(state_dir)

    def ctl(self, *args: str) -> None:
        servers.run(
            [str(servers.RABBIT_BIN_DIR / "rabbitmqctl"), "-n", self.entry.nodename, *args],
            env=servers.rabbit_env(self.entry, self.owner),
            cwd=Path(self.entry.root),
            timeout=120,
        ).check_returncode()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    state_dir = tmp_path_factory.mktemp("rabbit")
    node = Node(state_dir)
    try:
        yield node
    finally:
        servers.stop_rabbitmq(node.entry, node.owner)


async def unpublished(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM gin_table.outbox WHERE published_at IS NULL")
        )
    finally:
        await conn.close()


async def play_moves(api: Api, table_id: str, tokens: list[str], seconds: float) -> int:
    """Play the SOBRA's discard and stock draws for ``seconds``; every command must pass."""
    moves = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        public = await api.view(table_id)
        if public["status"] != "playing":
            return moves
        seat = public["hand"]["to_act"]
        view = await api.view(table_id, tokens[seat])
        legal = [m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard")]
        hint = view["hand"]["my_arrangement"].get("discard")
        move = {"type": "discard", "card": hint} if hint else legal[0]
        status, body = await api.command(table_id, tokens[seat], **move)
        assert status == 200, body  # no command fails while the broker is away
        moves += 1
        await asyncio.sleep(0.05)
    return moves


async def test_broker_stopped_for_20_s_loses_no_event_and_fails_no_command(
    node: Node, settings: Settings
) -> None:
    own = msgspec.structs.replace(settings, amqp_url=node.entry.url, relay_poll_s=0.5)
    tap_connection = await aio_pika.connect(own.amqp_url)
    async with tap_connection:
        channel = await tap_connection.channel()
        app = create_app(own, clock=Clock(), shuffle=SeededShuffle(11))
        async with TestClient(ProductionServer(app)) as client:
            api = Api(client, own)
            exchange = await channel.get_exchange(own.prefix + EVENTS_EXCHANGE)
            tap = await channel.declare_queue(own.prefix + "outage-tap", durable=True)
            await tap.bind(exchange, "table.*.*")  # before the table exists: from its seq 1
            table_id, a, b = await api.table_for_two()
            tokens = [a, b]
            before = await play_moves(api, table_id, tokens, 2.0)

            await asyncio.to_thread(node.ctl, "stop_app")
            during = await play_moves(api, table_id, tokens, OUTAGE_S)
            assert await unpublished(own.database_url) > 0  # events wait in the outbox
            await asyncio.to_thread(node.ctl, "start_app")
            after = await play_moves(api, table_id, tokens, 2.0)
            assert before > 0
            assert during > 0
            assert after > 0

            deadline = time.monotonic() + 60
            while await unpublished(own.database_url) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert await unpublished(own.database_url) == 0
            status, logged = await api.call("GET", f"/v1/tables/{table_id}/events?after=0")
            assert status == 200
            last_seq = logged[-1]["seq"]
    # Read the tap on a fresh connection: the durable queue kept what came after the outage.
    reader = await aio_pika.connect(own.amqp_url)
    async with reader:
        channel = await reader.channel()
        queue = await channel.declare_queue(own.prefix + "outage-tap", durable=True)
        seqs: list[int] = []
        while (message := await queue.get(fail=False, timeout=5)) is not None:
            await message.ack()
            envelope = envelope_decoder.decode(message.body)
            if envelope.table_id == table_id:
                seqs.append(envelope.seq)
        await queue.delete(if_unused=False, if_empty=False)
    distinct = sorted(set(seqs))
    assert distinct == list(range(distinct[0], distinct[-1] + 1)), "an event was lost"
    assert distinct[0] == 1  # the tap was bound before the table was created
    assert distinct[-1] == last_seq
    # In order: each seq first arrives after every smaller one.
    first_seen = [s for i, s in enumerate(seqs) if s not in seqs[:i]]
    assert first_seen == distinct


async def test_a_broker_restart_mid_match_does_not_stop_the_bot(
    node: Node, settings: Settings
) -> None:
    from services.bots.app import create_app as create_worker
    from services.bots.strategies import STRATEGIES

    own = msgspec.structs.replace(settings, amqp_url=node.entry.url, relay_poll_s=0.5)
    table_app = create_app(own, clock=Clock(), shuffle=SeededShuffle(5))
    worker_app = create_worker(own, {"luna": STRATEGIES["luna"]})
    async with (
        TestClient(ProductionServer(table_app)) as client,
        TestClient(ProductionServer(worker_app)),
    ):
        api = Api(client, own)
        token = api.token("Ana")
        created = await api.create(token)
        table_id = created["table_id"]
        status, _ = await api.call("POST", f"/v1/tables/{table_id}/bot", token, {"level": "luna"})
        assert status == 200

        async def bot_answers() -> int:
            """Play one person's move (when it is theirs) and wait for the bot's answer."""
            async with asyncio.timeout(60):
                while True:
                    view = await api.view(table_id, token)
                    if view["hand"]["to_act"] == 0:
                        break
                    await asyncio.sleep(0.1)
            legal = [m for m in view["legal"] if m["type"] in ("pass_upcard", "draw")]
            hint = view["hand"]["my_arrangement"].get("discard")
            move = {"type": "discard", "card": hint} if hint else legal[0]
            status, body = await api.command(table_id, token, **move)
            assert status == 200, body
            async with asyncio.timeout(60):
                while True:
                    after = await api.view(table_id, token)
                    if after["hand"] is None or after["hand"]["to_act"] == 0:
                        return int(after["version"])
                    await asyncio.sleep(0.1)

        await bot_answers()
        await asyncio.to_thread(node.ctl, "stop_app")
        await asyncio.sleep(3)
        await asyncio.to_thread(node.ctl, "start_app")
        before = (await api.view(table_id, token))["version"]
        after = await bot_answers()  # the worker reconnected and plays on
        assert after > before


async def test_after_a_broker_restart_a_socket_still_gets_what_comes_from_the_broker(
    node: Node, settings: Settings
) -> None:
    """Chat messages and timer notices reach a table's sockets only through the replica's own
    queue: after a restart the queue is restored and the replica consumes it again."""
    from datetime import UTC, datetime

    from shared.contracts.envelope import wrap
    from shared.contracts.events import MessagePosted
    from shared.contracts.names import chat_key
    from tests.table.conftest import ws_receive

    own = msgspec.structs.replace(settings, amqp_url=node.entry.url)
    app = create_app(own, clock=Clock(), shuffle=SeededShuffle(6))
    async with TestClient(ProductionServer(app)) as client:
        api = Api(client, own)
        ana = api.token("Ana")
        table_id = (await api.create(ana))["table_id"]
        async with client.ws_connect(f"/v1/tables/{table_id}/ws?token={ana}") as ws:
            assert (await ws_receive(ws))["kind"] == "snapshot"
            await asyncio.to_thread(node.ctl, "stop_app")
            await asyncio.sleep(3)
            await asyncio.to_thread(node.ctl, "start_app")
            connection = await aio_pika.connect_robust(node.entry.url)
            async with connection:
                channel = await connection.channel(publisher_confirms=True)
                events = await channel.get_exchange(own.prefix + EVENTS_EXCHANGE)
                got: dict[str, object] | None = None
                kinds: list[object] = []
                deadline = time.monotonic() + 60
                seq = 0
                while got is None and time.monotonic() < deadline:
                    seq += 1  # as the chat service would post, until the replica is back
                    posted = MessagePosted(message_id=seq, seat=0, name="Ana", text=f"oi {seq}")
                    body = msgspec.json.encode(wrap(table_id, seq, posted, datetime.now(UTC)))
                    await events.publish(aio_pika.Message(body), routing_key=chat_key(table_id))
                    with contextlib.suppress(TimeoutError):
                        while got is None:
                            frame = await ws_receive(ws, within_s=1.0)
                            kinds.append(frame["kind"])
                            got = frame if frame["kind"] == "event" else None
                # What came while the queue was gone is read back: a snapshot again says so.
                while "snapshot" not in kinds:
                    kinds.append((await ws_receive(ws, within_s=10.0))["kind"])
        assert got is not None, "no chat message reached the socket after the restart"
        assert kinds.count("snapshot") == 1, kinds
        assert got["kind"] == "event"
        assert got["event"]["type"] == "message_posted"
        assert got["event"]["table_id"] == table_id
