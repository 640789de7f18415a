"""RabbitMQ: the connection and the topology every service relies on (docs/DESIGN.md section 3)."""

from __future__ import annotations

import random
import re

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from pamqp.common import FieldValue
from yarl import URL

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

log = structlog.get_logger()
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


# GIN_AMQP_URL names one broker address, or every node of a cluster as libpq names several
# PostgreSQL hosts: one URL with several host:port pairs, amqp://user:password@h1:5672,h2:5672/
# vhost (the nodes of a cluster share their users and vhosts, so they share the rest).
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^@/?#]*@)?(?P<hosts>[^/?#]*)(?P<rest>.*)",
    re.DOTALL,
)
CONNECT_TIMEOUT_S = 10.0  # per node, with several: a node that never answers is passed over
# With several nodes, the pause between attempts (aio-pika's reconnect_interval, 5 s by default,
# also the least time between two reconnects): the next node is likely up, so try it soon.
RECONNECT_INTERVAL_S = 1.0


def node_urls(url: str) -> list[str]:
    """The URL of each node that ``url`` names, in its order.

    >>> node_urls("amqp://gin:s3cret@10.0.0.1:5672,10.0.0.2:5673/gin?heartbeat=10")
    ['amqp://gin:s3cret@10.0.0.1:5672/gin?heartbeat=10', 'amqp://gin:s3cret@10.0.0.2:5673/gin?heartbeat=10']
    >>> node_urls("amqp://guest:guest@127.0.0.1:5672/")
    ['amqp://guest:guest@127.0.0.1:5672/']
    """
    parts = _URL.fullmatch(url)
    if parts is None or "," not in parts["hosts"]:
        return [url]
    head, tail = parts["scheme"] + (parts["userinfo"] or ""), parts["rest"]
    hosts = [host.strip() for host in parts["hosts"].split(",")]
    if not all(hosts):
        raise ValueError(f"an empty host in the broker URL {redacted(url)}")
    return [head + host + tail for host in hosts]


def redacted(url: str) -> str:
    """``url`` (of one node or several) with its password replaced by ``***``, for logs.

    >>> redacted("amqp://gin:s3cret@h1:5672,h2:5672/gin")
    'amqp://gin:***@h1:5672,h2:5672/gin'
    """
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*):[^@/?#]*@", r"\1:***@", url)


async def connect(url: str) -> AbstractRobustConnection:
    """A connection that reconnects by itself and restores its channels and queues.

    Given several nodes (``node_urls``), it connects to the first that answers, starting at a
    random one so that a service's replicas spread over the cluster, and each time its
    connection is lost, or an attempt to make it again fails, it tries the next node.
    """
    nodes = node_urls(url)
    if len(nodes) == 1:
        return await aio_pika.connect_robust(url, client_properties={"connection_name": "gin"})
    start = random.randrange(len(nodes))
    nodes = nodes[start:] + nodes[:start]
    failure: Exception | None = None
    for index, node in enumerate(nodes):
        try:
            connection = await aio_pika.connect_robust(
                node,
                client_properties={"connection_name": "gin"},
                timeout=CONNECT_TIMEOUT_S,
                reconnect_interval=RECONNECT_INTERVAL_S,
            )
        except CONNECTION_EXCEPTIONS as exc:  # that node is away: the next
            log.warning("broker_node_unreachable", node=redacted(node), error=repr(exc))
            failure = exc
            continue
        assert isinstance(connection, aio_pika.RobustConnection)
        _move_on_loss(connection, nodes, index)
        return connection
    assert failure is not None
    raise failure


def _move_on_loss(connection: aio_pika.RobustConnection, nodes: list[str], index: int) -> None:
    """Point a robust connection at the next node whenever it closes without being closed.

    aio-pika's RobustConnection makes each attempt with its ``url`` attribute and calls its
    ``close_callbacks`` when the connection is lost and when an attempt fails (its
    ``transport`` then None). A connection whose channels could not be restored calls them
    twice with the same transport: that moves once. tests/infra/test_broker_cluster.py holds
    aio-pika to this.
    """
    at = index
    left: object = None  # the transport last moved away from

    def next_node(_: object, exc: BaseException | None = None) -> None:
        nonlocal at, left
        transport = connection.transport
        if connection.close_called or (transport is not None and transport is left):
            return
        left = transport
        at = (at + 1) % len(nodes)
        connection.url = URL(nodes[at])
        log.warning("broker_connection_lost", error=repr(exc), next_node=redacted(nodes[at]))

    connection.close_callbacks.add(next_node)


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
    """Remove what ``declare_topology`` made, the chat's queue, which that service declares,
    and the timers' former one (test runs clean up their prefix: a queue left behind keeps its
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
