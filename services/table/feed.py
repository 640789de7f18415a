"""The hub's feed from the broker: this replica's exclusive queue and what it is bound to.

Each replica has one exclusive queue, so it works with any number of replicas. Every table
event reaches every replica's queue from ``gin.sockets``, one message per relay batch; chat
and timer events come from ``gin.events``, bound by routing key for the tables this
replica's clients watch (``watched_keys``), and unbound when the last watcher leaves.

The feed only speaks to the broker and hands on what it hears: which events to send, and to
whom, is the hub's (``hub.py``), through the ``Listener`` it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

import msgspec
import structlog
from aio_pika.abc import (
    AbstractExchange,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from aiormq.abc import DeliveredMessage

from shared.contracts.compat import decode_envelope
from shared.contracts.envelope import Envelope
from shared.contracts.names import EVENTS_EXCHANGE, SOCKETS_EXCHANGE

log = structlog.get_logger()
# A bind waits this long at most for the broker (a robust channel waits for its connection).
BIND_TIMEOUT_S = 2.0


class _Head(msgspec.Struct):
    """Where an event belongs: enough to skip one this replica has sent already."""

    table_id: str
    seq: int
    type: str = ""


_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_head_decoder = msgspec.json.Decoder(_Head)


class Listener(Protocol):
    """What the feed hands on (the hub)."""

    async def deliver_batch(self, body: bytes) -> None:
        """A relay batch of table events from ``gin.sockets``."""

    async def deliver(self, envelope: Envelope) -> None:
        """A chat or timer event from ``gin.events``."""

    async def resync(self) -> None:
        """The feed's channel was reopened (after a reconnect, or alone): consume again and
        catch up."""


def watched_keys(table_id: str) -> tuple[str, ...]:
    """The routing keys on ``gin.events`` of what a table's sockets receive besides its
    events (those come from ``gin.sockets``): chat and timers."""
    return (f"chat.{table_id}.*", f"timer.{table_id}.*")


def batch_heads(body: bytes) -> Iterator[tuple[_Head, msgspec.Raw]]:
    """Each event of a relay batch (a JSON array of envelopes, of any tables): its table and
    seq, decoded alone, and the envelope still raw (decoded only if it is to be sent)."""
    for raw in _batch_decoder.decode(body):
        yield _head_decoder.decode(raw), raw


class Feed:
    """This replica's queue on the broker, consumed without acks, and its bindings."""

    def __init__(self, prefix: str, listener: Listener) -> None:
        self.prefix = prefix
        self.listener = listener
        self.channel: AbstractRobustChannel | None = None
        self.queue: AbstractQueue | None = None
        self.exchange: AbstractExchange | None = None
        self.batches = prefix + SOCKETS_EXCHANGE

    async def start(self, connection: AbstractRobustConnection) -> None:
        """Open this replica's queue, bound to ``gin.sockets``, and consume."""
        self.channel = await connection.channel()
        await self.channel.set_qos(prefetch_count=256)
        self.exchange = await self.channel.get_exchange(self.prefix + EVENTS_EXCHANGE)
        # Named here, not by aio-pika (amq_...): gin.sockets.<32 hex digits>, this replica's,
        # is the only name of its kind the table's broker user may configure in production.
        self.queue = await self.channel.declare_queue(
            f"{self.batches}.{uuid.uuid4().hex}", exclusive=True, auto_delete=True
        )
        await self.queue.bind(self.batches)
        await self.consume()
        # Reopened after a reconnect, and also alone (a channel error, a consumer cancelled
        # by the broker): either way the queue is back but nothing consumes it.
        self.channel.reopen_callbacks.add(self._on_reopen)

    async def consume(self) -> None:
        """Consume on the channel's aiormq channel, without acks: this queue dies with the
        replica, and a lost event is refilled from the log. (aio-pika's message object for each
        delivery cost more than the delivery itself.) aio-pika restores the queue and its
        bindings when it reopens the channel, but not a consumer it did not make: the
        listener's ``resync`` consumes again."""
        assert self.channel is not None
        assert self.queue is not None
        channel = await self.channel.get_underlay_channel()
        await channel.basic_consume(self.queue.name, self._on_delivery, no_ack=True)

    async def bind(self, table_id: str) -> None:
        """Hear a table's chat and timer events on this replica's queue."""
        if self.queue is None or self.exchange is None:
            return
        async with asyncio.timeout(BIND_TIMEOUT_S):
            for key in watched_keys(table_id):
                await self.queue.bind(self.exchange, key)

    async def unbind(self, table_id: str, watched: Callable[[str], bool]) -> None:
        """Stop hearing a table nobody here watches now (unless ``watched`` says someone
        came back)."""
        if self.queue is None or self.exchange is None:
            return
        with contextlib.suppress(Exception):  # the broker may be away; no harm
            for key in watched_keys(table_id):
                if watched(table_id):
                    return
                await self.queue.unbind(self.exchange, key)

    async def _on_delivery(self, message: DeliveredMessage) -> None:
        try:
            if message.exchange == self.batches:
                await self.listener.deliver_batch(message.body)
            else:  # chat and timer events; a newer contract's type is skipped (compat)
                envelope = decode_envelope(message.body)
                if isinstance(envelope, Envelope):
                    await self.listener.deliver(envelope)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ws_event_undecodable", error=str(exc))

    def _on_reopen(self, *_: object) -> None:
        asyncio.get_running_loop().create_task(self.listener.resync())
