"""RabbitMQ: the connection and the topology every service relies on (docs/DESIGN.md section 3)."""

from __future__ import annotations

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection

from shared.contracts.events import BotLevel
from shared.contracts.names import (
    BOTS_EXCHANGE,
    COMMANDS_QUEUE,
    DEAD_LETTER,
    EVENTS_EXCHANGE,
    HISTORY_STREAM,
    SOCKETS_EXCHANGE,
    bot_key,
    bot_queue,
)
from shared.infra.internals import Outgoing as Outgoing
from shared.infra.internals import publish_confirmed as publish_confirmed

BOT_LEVELS: tuple[BotLevel, ...] = ("tito", "carmen", "luna")
# The history of gin.events (docs/subscribing.md): a stream queue that keeps every event for 7
# days or 20 GB, whichever is reached first (retention drops whole segments of 100 MB), so a
# new subscriber reads from the first kept event or from a timestamp. The prod overlay declares
# the same arguments (deploy/k8s/overlays/prod/rabbitmq-topology.yaml): a difference refuses
# the services' start with PRECONDITION_FAILED.
HISTORY_ARGUMENTS: dict[str, object] = {
    "x-queue-type": "stream",
    "x-max-age": "7D",
    "x-max-length-bytes": 20_000_000_000,
    "x-stream-max-segment-size-bytes": 100_000_000,
}


async def connect(url: str) -> AbstractRobustConnection:
    """A connection that reconnects by itself and restores its channels and queues."""
    return await aio_pika.connect_robust(url, client_properties={"connection_name": "gin"})


async def declare_topology(channel: AbstractChannel, prefix: str) -> dict[str, AbstractExchange]:
    """Declare the exchanges and shared queues (idempotent); the exchanges by unprefixed name.

    Poison messages of the command and bot queues go to the dead-letter queue. Every event
    of ``gin.events`` is also kept in the history stream ``HISTORY_STREAM``.
    """
    dead = await channel.declare_exchange(
        prefix + DEAD_LETTER, aio_pika.ExchangeType.FANOUT, durable=True
    )
    dead_queue = await channel.declare_queue(prefix + DEAD_LETTER, durable=True)
    await dead_queue.bind(dead)
    events = await channel.declare_exchange(
        prefix + EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
    )
    bots = await channel.declare_exchange(
        prefix + BOTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
    )
    sockets = await channel.declare_exchange(
        prefix + SOCKETS_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True
    )
    history = await channel.declare_queue(
        prefix + HISTORY_STREAM,
        durable=True,
        arguments=HISTORY_ARGUMENTS,  # type: ignore[arg-type]
    )
    await history.bind(events, "#")
    work_queue_args: dict[str, object] = {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": prefix + DEAD_LETTER,
    }
    await channel.declare_queue(
        prefix + COMMANDS_QUEUE,
        durable=True,
        arguments=work_queue_args,  # type: ignore[arg-type]
    )
    for level in BOT_LEVELS:
        queue = await channel.declare_queue(
            prefix + bot_queue(level),
            durable=True,
            arguments=work_queue_args,  # type: ignore[arg-type]
        )
        await queue.bind(bots, bot_key(level))
    return {
        EVENTS_EXCHANGE: events,
        BOTS_EXCHANGE: bots,
        SOCKETS_EXCHANGE: sockets,
        DEAD_LETTER: dead,
    }


async def delete_topology(channel: AbstractChannel, prefix: str) -> None:
    """Remove what ``declare_topology`` made (test runs clean up their prefix)."""
    queues = [
        COMMANDS_QUEUE,
        DEAD_LETTER,
        HISTORY_STREAM,
        *(bot_queue(level) for level in BOT_LEVELS),
    ]
    for queue in queues:
        await channel.queue_delete(prefix + queue)
    for exchange in (EVENTS_EXCHANGE, BOTS_EXCHANGE, SOCKETS_EXCHANGE, DEAD_LETTER):
        await channel.exchange_delete(prefix + exchange)
