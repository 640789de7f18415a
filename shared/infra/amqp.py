"""RabbitMQ: the connection and the topology every service relies on (docs/DESIGN.md section 3)."""

from __future__ import annotations

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection
from pamqp.common import FieldValue

from shared.contracts.events import BotLevel
from shared.contracts.names import (
    BOTS_EXCHANGE,
    CHAT_QUEUE,
    COMMANDS_EXCHANGE,
    COMMANDS_QUEUE,
    DEAD_LETTER,
    EVENTS_EXCHANGE,
    HISTORY_STREAM,
    SOCKETS_EXCHANGE,
    TIMERS_QUEUE,
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
HISTORY_ARGUMENTS: dict[str, FieldValue] = {
    "x-queue-type": "stream",
    "x-max-age": "7D",
    "x-max-length-bytes": 20_000_000_000,
    "x-stream-max-segment-size-bytes": 100_000_000,
}


# Dead letters (docs/DESIGN.md section 3). gin.dead is a quorum queue, replicated like the work
# queues, and each work queue hands over what it rejects at least once: RabbitMQ (3.10 and
# later) keeps a dead letter in its source quorum queue until gin.dead has confirmed it, so a
# dead letter survives gin.dead being away, unbound or being recreated; at most once (the
# default) drops it. The broker honours the strategy only with reject-publish overflow (with
# drop-head it falls back to at most once); with no length limit set that changes nothing for
# publishers, and they all publish with confirms and retry a nack. The prod overlay declares
# the same arguments: a difference refuses the services' start with PRECONDITION_FAILED, and an
# existing queue declared otherwise must be recreated (deploy/README.md).
DEAD_LETTER_ARGUMENTS: dict[str, FieldValue] = {"x-queue-type": "quorum"}


def work_queue_arguments(prefix: str) -> dict[str, FieldValue]:
    """The arguments of a work queue: quorum, its rejected messages to ``gin.dead`` at least
    once."""
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": prefix + DEAD_LETTER,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


async def connect(url: str) -> AbstractRobustConnection:
    """A connection that reconnects by itself and restores its channels and queues."""
    return await aio_pika.connect_robust(url, client_properties={"connection_name": "gin"})


# Who declares what at start (None: everything, for tests and tools). In production the
# Messaging Topology Operator declares the shared topology first; each service declares again
# what it owns or publishes to (a difference in arguments refuses its start), and nothing else:
# its broker user may configure nothing else (deploy/k8s/overlays/prod/rabbitmq-topology.yaml).
# The table owns gin.commands, gin.dead and gin.sockets; the bots their queues; the history
# stream is declared by each publisher of gin.events, so none publishes before it is bound.
SERVICES = ("table", "chat", "timers", "bots")


async def declare_topology(
    channel: AbstractChannel, prefix: str, service: str | None = None
) -> dict[str, AbstractExchange]:
    """Declare the exchanges and shared queues a service owns (idempotent), or all of them
    when ``service`` is None; return the exchanges it publishes to, by unprefixed name.

    Poison messages of the command and bot queues go to the dead-letter queue, at least once
    (``work_queue_arguments``). Every event
    of ``gin.events`` is also kept in the history stream ``HISTORY_STREAM``. Bots and timers
    send commands through ``COMMANDS_EXCHANGE``, which the table service declares: theirs is a
    reference, not a declaration (their users may not configure it).
    """
    if service is not None and service not in SERVICES:
        raise ValueError(f"no broker topology for the service {service!r}")
    every = service is None
    exchanges: dict[str, AbstractExchange] = {}
    work_queue_args = work_queue_arguments(prefix)

    async def exchange(name: str, kind: aio_pika.ExchangeType) -> AbstractExchange:
        exchanges[name] = await channel.declare_exchange(prefix + name, kind, durable=True)
        return exchanges[name]

    if every or service == "table":
        dead = await exchange(DEAD_LETTER, aio_pika.ExchangeType.FANOUT)
        dead_queue = await channel.declare_queue(
            prefix + DEAD_LETTER,
            durable=True,
            arguments=DEAD_LETTER_ARGUMENTS,
        )
        await dead_queue.bind(dead)
        await exchange(SOCKETS_EXCHANGE, aio_pika.ExchangeType.FANOUT)
        commands = await exchange(COMMANDS_EXCHANGE, aio_pika.ExchangeType.DIRECT)
        commands_queue = await channel.declare_queue(
            prefix + COMMANDS_QUEUE,
            durable=True,
            arguments=work_queue_args,
        )
        await commands_queue.bind(commands, prefix + COMMANDS_QUEUE)
    if every or service in ("table", "chat", "timers"):
        events = await exchange(EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC)
        history = await channel.declare_queue(
            prefix + HISTORY_STREAM,
            durable=True,
            arguments=HISTORY_ARGUMENTS,
        )
        await history.bind(events, "#")
    if every or service in ("table", "bots"):
        bots = await exchange(BOTS_EXCHANGE, aio_pika.ExchangeType.TOPIC)
    if every or service == "bots":
        for level in BOT_LEVELS:
            queue = await channel.declare_queue(
                prefix + bot_queue(level),
                durable=True,
                arguments=work_queue_args,
            )
            await queue.bind(bots, bot_key(level))
    if service in ("bots", "timers"):
        exchanges[COMMANDS_EXCHANGE] = await channel.get_exchange(
            prefix + COMMANDS_EXCHANGE, ensure=False
        )
    return exchanges


async def delete_topology(channel: AbstractChannel, prefix: str) -> None:
    """Remove what ``declare_topology`` made, and the chat's and the timers' queues, which
    those services declare (test runs clean up their prefix: a queue left behind keeps its
    messages on the broker for good)."""
    queues = [
        COMMANDS_QUEUE,
        DEAD_LETTER,
        HISTORY_STREAM,
        *(bot_queue(level) for level in BOT_LEVELS),
        CHAT_QUEUE,
        TIMERS_QUEUE,
    ]
    for queue in queues:
        await channel.queue_delete(prefix + queue)
    for exchange in (
        EVENTS_EXCHANGE,
        BOTS_EXCHANGE,
        SOCKETS_EXCHANGE,
        DEAD_LETTER,
        COMMANDS_EXCHANGE,
    ):
        await channel.exchange_delete(prefix + exchange)
