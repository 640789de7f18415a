"""Dead letters on a real RabbitMQ (issue 27, item 5): ``gin.dead`` is a quorum queue and the
work queues hand it their poison messages at least once.

On the run's broker: the queues ``amqp.declare_topology`` made carry what the broker needs for
at-least-once dead-lettering (it refuses a redeclaration without it), and a poison command and
a poison bot turn, rejected by the shared consumer runner, end in ``gin.dead``. On a node of
this module's own (its dead-letter worker retrying every second instead of every three
minutes): with ``gin.dead`` deleted, as its migration from a classic queue does, a rejected
command and bot turn wait in their queues and reach ``gin.dead`` once it is declared again,
while a queue dead-lettering at most once (the arguments before this change) loses its own.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aiormq.exceptions import ChannelPreconditionFailed
from prometheus_client import CollectorRegistry

from services.chat import consumer as chat_consumer
from services.table.consumer import decode_command
from shared.contracts.compat import decode_bot_turn
from shared.contracts.names import (
    BOTS_EXCHANGE,
    COMMANDS_EXCHANGE,
    COMMANDS_QUEUE,
    DEAD_LETTER,
    bot_key,
    bot_queue,
)
from shared.infra import amqp
from shared.infra.consumer import Consumer, ConsumerMetrics
from shared.infra.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import servers  # noqa: E402

POISON_COMMAND = b'{"not": "a command"}'
POISON_TURN = b'{"not": "a turn"}'
WORK_QUEUES = (COMMANDS_QUEUE, *(bot_queue(level) for level in amqp.BOT_LEVELS))


@pytest.fixture
async def prefix(settings: Settings) -> AsyncIterator[str]:
    """The whole topology under a prefix of this test's own (no other test's consumer takes
    its messages), removed at the end."""
    own = f"{settings.prefix}dead-letters-{uuid.uuid4().hex[:8]}."
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        await amqp.declare_topology(await connection.channel(), own)
        try:
            yield own
        finally:
            await amqp.delete_topology(await connection.channel(), own)


async def refusal(connection: AbstractConnection, name: str, arguments: dict[str, Any]) -> str:
    """The broker's PRECONDITION_FAILED for declaring the queue so, or "" if it agreed (on a
    channel of its own: a refusal closes it)."""
    channel = await connection.channel()
    try:
        await channel.declare_queue(name, durable=True, arguments=arguments)
    except ChannelPreconditionFailed as exc:
        return str(exc)
    finally:
        if not channel.is_closed:
            await channel.close()
    return ""


def without(arguments: dict[str, object], name: str) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if k != name}


async def test_gin_dead_is_quorum_and_work_queues_dead_letter_at_least_once(
    settings: Settings, prefix: str
) -> None:
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        dead = prefix + DEAD_LETTER
        assert await refusal(connection, dead, dict(amqp.DEAD_LETTER_ARGUMENTS)) == ""
        assert "inequivalent arg 'x-queue-type'" in await refusal(
            connection, dead, {"x-queue-type": "classic"}
        )
        arguments = amqp.work_queue_arguments(prefix)
        assert arguments["x-dead-letter-strategy"] == "at-least-once"
        assert arguments["x-overflow"] == "reject-publish"  # else the broker uses at most once
        for queue in WORK_QUEUES:
            name = prefix + queue
            assert await refusal(connection, name, arguments) == "", name
            # What the broker holds: a declaration without either is refused.
            for argument in ("x-dead-letter-strategy", "x-overflow"):
                refused = await refusal(connection, name, without(arguments, argument))
                assert f"inequivalent arg '{argument}'" in refused, (name, refused)


async def test_the_chat_queue_dead_letters_at_least_once_too(
    settings: Settings, prefix: str
) -> None:
    """The chat's queue, which its service declares, dead-letters to gin.dead as the others
    do: the broker refuses it declared without the strategy."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        declared = [await chat_consumer.declare_queue(channel, prefix)]
        for queue in declared:
            arguments = dict(queue.arguments or {})
            assert arguments["x-dead-letter-exchange"] == prefix + DEAD_LETTER
            assert arguments["x-dead-letter-strategy"] == "at-least-once", queue.name
            assert arguments["x-overflow"] == "reject-publish", queue.name
            refused = await refusal(
                connection, queue.name, without(arguments, "x-dead-letter-strategy")
            )
            assert "inequivalent arg 'x-dead-letter-strategy'" in refused, queue.name


async def dead_letters(
    channel: AbstractChannel, name: str, count: int, within_s: float
) -> list[AbstractIncomingMessage]:
    """Up to ``count`` messages taken from the queue ``name`` within ``within_s``."""
    queue = await channel.get_queue(name)
    found: list[AbstractIncomingMessage] = []
    deadline = time.monotonic() + within_s
    while len(found) < count and time.monotonic() < deadline:
        message = await queue.get(fail=False)
        if message is None:
            await asyncio.sleep(0.05)
            continue
        await message.ack()
        found.append(message)
    return found


def died_in(message: AbstractIncomingMessage) -> tuple[str, str]:
    """The queue a dead letter came from and why (its first x-death entry)."""
    deaths = message.headers["x-death"]
    assert isinstance(deaths, list)
    first = deaths[0]
    assert isinstance(first, dict)
    return str(first["queue"]), str(first["reason"])


async def never(_: object) -> None:
    raise AssertionError("a poison message was decoded")


async def test_a_poison_command_and_bot_turn_end_in_gin_dead(
    settings: Settings, prefix: str
) -> None:
    metrics = ConsumerMetrics(CollectorRegistry())
    commands = Consumer("table_commands", decode_command, never, metrics)
    turns = Consumer("bot_turns", decode_bot_turn, never, metrics)
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await commands.start([await channel.get_queue(prefix + COMMANDS_QUEUE)])
        await turns.start([await channel.get_queue(prefix + bot_queue("tito"))])
        try:
            # As the timers and the bots send commands, and the table's relay sends turns.
            commands_in = await channel.get_exchange(prefix + COMMANDS_EXCHANGE)
            await commands_in.publish(
                aio_pika.Message(POISON_COMMAND), routing_key=prefix + COMMANDS_QUEUE
            )
            bots = await channel.get_exchange(prefix + BOTS_EXCHANGE)
            await bots.publish(aio_pika.Message(POISON_TURN), routing_key=bot_key("tito"))
            found = await dead_letters(channel, prefix + DEAD_LETTER, 2, within_s=10)
        finally:
            await commands.stop()
            await turns.stop()
    assert {m.body: died_in(m) for m in found} == {
        POISON_COMMAND: (prefix + COMMANDS_QUEUE, "rejected"),
        POISON_TURN: (prefix + bot_queue("tito"), "rejected"),
    }
    for consumer in ("table_commands", "bot_turns"):
        assert metrics.dead_lettered.labels(consumer, "undecodable")._value.get() == 1


# --- at least once, on a node of this module's own -------------------------------------------

# The dead-letter worker of each source queue retries what no queue confirmed every
# dead_letter_worker_publisher_confirm_timeout (3 minutes by default); a quorum queue's
# counts (rabbitmqctl list_queues) are refreshed every quorum_tick_interval (5 s).
ADVANCED_CONFIG = """[{rabbit, [
    {dead_letter_worker_publisher_confirm_timeout, 1000},
    {quorum_tick_interval, 500}
]}].
"""
CONTROL = "gin.at-most-once"  # a work queue declared as before this change


@dataclass
class Node:
    entry: servers.RabbitState
    owner: str

    def queues(self) -> dict[str, dict[str, Any]]:
        """``rabbitmqctl list_queues``: each queue's type, arguments and counts, by name."""
        result = servers.run(
            [
                str(servers.RABBIT_BIN_DIR / "rabbitmqctl"),
                "-n",
                self.entry.nodename,
                "list_queues",
                "-q",
                "--formatter",
                "json",
                "name",
                "type",
                "arguments",
                "messages",
                "messages_ready",
                "messages_unacknowledged",
            ],
            env=servers.rabbit_env(self.entry, self.owner),
            cwd=Path(self.entry.root),
            timeout=60,
        )
        assert result.returncode == 0, servers.output_of(result)
        found: dict[str, dict[str, Any]] = {}
        for queue in json.loads(result.stdout):
            queue["arguments"] = {name: value for name, _, value in queue["arguments"]}
            found[queue.pop("name")] = queue
        return found


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    state_dir = tmp_path_factory.mktemp("rabbit")
    (state_dir / "rabbitmq").mkdir()
    (state_dir / "rabbitmq" / "advanced.config").write_text(ADVANCED_CONFIG)
    entry = servers.start_rabbitmq(
        state_dir, servers.load_state(state_dir), servers.Installer(), 180
    )
    owner = servers.owner_of(state_dir)
    try:
        yield Node(entry, owner)
    finally:
        servers.stop_rabbitmq(entry, owner)


async def reject_one(channel: AbstractChannel, name: str) -> bytes:
    """Take the one message of a queue and reject it without requeue (dead-letter it), as
    the consumer runner does with a poison message."""
    queue = await channel.get_queue(name)
    async with asyncio.timeout(10):
        while (message := await queue.get(fail=False)) is None:
            await asyncio.sleep(0.05)
    await message.reject(requeue=False)
    return message.body


async def held(node: Node, counts: dict[str, int], within_s: float = 20) -> dict[str, Any]:
    """Wait until each queue counts that many messages and none ready or unacknowledged (a
    dead letter waiting for its target counts so); the queues as last listed."""
    deadline = time.monotonic() + within_s
    while True:
        queues = await asyncio.to_thread(node.queues)
        seen = {name: (queues[name]["messages"], queues[name]["messages_ready"]) for name in counts}
        unacked = sum(queues[name]["messages_unacknowledged"] for name in counts)
        if unacked == 0 and seen == {name: (n, 0) for name, n in counts.items()}:
            return queues
        if time.monotonic() > deadline:
            pytest.fail(f"(messages, ready) by queue: {seen}, {unacked} unacknowledged")
        await asyncio.sleep(0.5)


@pytest.mark.slow
async def test_a_dead_letter_waits_in_its_queue_while_gin_dead_is_away(node: Node) -> None:
    connection = await aio_pika.connect(node.entry.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await amqp.declare_topology(channel, "")
        await channel.declare_queue(
            CONTROL,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-dead-letter-exchange": DEAD_LETTER},
        )
        queues = await asyncio.to_thread(node.queues)
        assert queues[DEAD_LETTER]["type"] == "quorum"
        for queue in WORK_QUEUES:
            assert queues[queue]["type"] == "quorum"
            assert queues[queue]["arguments"] == amqp.work_queue_arguments(""), queue

        # gin.dead away (deleted, as moving it from a classic queue does), its exchange left.
        await channel.queue_delete(DEAD_LETTER)
        commands_in = await channel.get_exchange(COMMANDS_EXCHANGE)
        await commands_in.publish(aio_pika.Message(POISON_COMMAND), routing_key=COMMANDS_QUEUE)
        bots = await channel.get_exchange(BOTS_EXCHANGE)
        await bots.publish(aio_pika.Message(POISON_TURN), routing_key=bot_key("tito"))
        await channel.default_exchange.publish(aio_pika.Message(b"lost"), routing_key=CONTROL)
        for queue in (COMMANDS_QUEUE, bot_queue("tito"), CONTROL):
            await reject_one(channel, queue)
        # Held by their queues, neither ready nor unacknowledged; at most once dropped its own.
        await held(node, {COMMANDS_QUEUE: 1, bot_queue("tito"): 1, CONTROL: 0})

        await amqp.declare_topology(channel, "")  # gin.dead back, bound to its exchange
        found = await dead_letters(channel, DEAD_LETTER, 3, within_s=8)
        assert {m.body: died_in(m) for m in found} == {
            POISON_COMMAND: (COMMANDS_QUEUE, "rejected"),
            POISON_TURN: (bot_queue("tito"), "rejected"),
        }
        await held(node, {COMMANDS_QUEUE: 0, bot_queue("tito"): 0, DEAD_LETTER: 0})

        # The at-most-once queue's letter was lost for want of gin.dead, not for its route.
        await channel.default_exchange.publish(aio_pika.Message(b"kept"), routing_key=CONTROL)
        await reject_one(channel, CONTROL)
        (kept,) = await dead_letters(channel, DEAD_LETTER, 1, within_s=10)
        assert (kept.body, died_in(kept)) == (b"kept", (CONTROL, "rejected"))


async def test_make_dev_makes_queues_of_an_earlier_release_again(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A developer's broker keeps the classic gin.dead an earlier make dev declared, which
    this release's declaration would refuse (PRECONDITION_FAILED): make dev says so and
    makes the queues again."""
    import dev

    own = f"{settings.prefix}dev-{uuid.uuid4().hex[:8]}."
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(own + DEAD_LETTER, durable=True)  # classic, as before
        try:
            await dev.declare_topology(settings.amqp_url, own)
            assert "are made again" in capsys.readouterr().out
            assert await refusal(connection, own + DEAD_LETTER, {"x-queue-type": "quorum"}) == ""
            await dev.declare_topology(settings.amqp_url, own)  # now as declared: nothing said
            assert capsys.readouterr().out == ""
        finally:
            await amqp.delete_topology(await connection.channel(), own)
