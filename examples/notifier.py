#!/usr/bin/env python3
"""An example notifier of Selminha Gin's turn reminders (issue 33, docs/subscribing.md).

It reads ``turn_reminder`` events (``timer.<table_id>.turn_reminder`` on ``gin.events``) from a
durable queue of its own, so reminders published while it is stopped wait for it, and prints,
one a line, the message a notifier would send the seat to act, in Brazilian Portuguese:

    mesa Xk3, assento 1: Sua vez na mesa Xk3 há 24 h; a partir de 07/12 às 15:02 (horário de
    Brasília) o adversário pode reivindicar a partida.

It needs only the contracts (``pip install selminha-gin-contracts``, i.e. msgspec) and
aio-pika. Settings: ``GIN_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``) and
``GIN_PREFIX`` (default empty: the prefix of every exchange and queue name).

    python examples/notifier.py
        declare (if need be) and read the queue gin.notifier.reminders until interrupted
    python examples/notifier.py --queue gin.sub.notifier.queue --idle-exit 5
        the queue deploy/k8s/components/subscriber made for the team (used as it is, and
        bound to timer.*.turn_reminder too); exit after 5 s with nothing new

A real notifier knows who sits in the seat (``seat_taken`` events, or the table's view) and
sends the message to that person; this one prints it. Delivery is at least once: a reminder is
recognised by its envelope ``id`` (kept in memory here; a real notifier keeps the ids it sent
with what it sent, in one transaction). Event types this code does not know are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import aio_pika
import msgspec
from aio_pika.abc import AbstractIncomingMessage

from shared.contracts.compat import decode_envelope
from shared.contracts.envelope import Envelope
from shared.contracts.events import TurnReminder
from shared.contracts.names import EVENTS_EXCHANGE, timer_key

QUEUE = "gin.notifier.reminders"
BRASILIA = "America/Sao_Paulo"


def zone(name: str) -> ZoneInfo | None:
    """The time zone the times are told in (None: the system has no zone data; UTC then)."""
    try:
        return ZoneInfo(name)
    except ZoneInfoNotFoundError:
        return None


def waited(seconds: float) -> str:
    """How long a turn has waited, as a person says it.

    >>> waited(86400.4), waited(158400.0), waited(2700.0)
    ('24 h', '44 h', '45 min')
    """
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return f"{int(seconds // 3600)} h"


def when(moment: datetime, tz: ZoneInfo | None) -> str:
    """A moment as a Brazilian reads it: day/month and the time, in Brasília's time."""
    if tz is None:
        return moment.strftime("%d/%m às %H:%M (UTC)")
    return moment.astimezone(tz).strftime("%d/%m às %H:%M (horário de Brasília)")


def message(table_id: str, reminder: TurnReminder, tz: ZoneInfo | None) -> str:
    """What the seat to act is told (pt-BR)."""
    lead = f"Sua vez na mesa {table_id} há {waited(reminder.waited_s)}"
    if reminder.reminder == "claimable":
        return f"{lead}; o adversário já pode reivindicar a partida por ausência."
    return (
        f"{lead}; a partir de {when(reminder.claimable_at, tz)}"
        " o adversário pode reivindicar a partida."
    )


class Notifier:
    """Prints each reminder of its queue once."""

    def __init__(self, tz: ZoneInfo | None) -> None:
        self.tz = tz
        self.sent: set[str] = set()
        self.arrived = asyncio.Event()

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Print a reminder the first time it comes, then acknowledge it."""
        self.arrived.set()
        try:
            envelope = decode_envelope(message.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            print(f"not an event ({exc}): skipped", file=sys.stderr)
        else:
            if isinstance(envelope, Envelope) and isinstance(envelope.data, TurnReminder):
                self.notify(envelope, envelope.data)
        await message.ack()

    def notify(self, envelope: Envelope, reminder: TurnReminder) -> None:
        key = str(envelope.id)
        if key in self.sent:
            return
        self.sent.add(key)
        text = message(envelope.table_id, reminder, self.tz)
        print(f"mesa {envelope.table_id}, assento {reminder.seat}: {text}", flush=True)


async def own_queue(
    connection: aio_pika.abc.AbstractConnection, name: str
) -> aio_pika.abc.AbstractQueue:
    """The notifier's durable queue: the one already there (in production, made by
    deploy/k8s/components/subscriber with its dead-letter queue: ``--queue
    gin.sub.<name>.queue``), else a quorum queue declared here (development)."""
    probe = await connection.channel()
    try:
        queue = await probe.get_queue(name)  # passive: whatever its arguments
    except aio_pika.exceptions.ChannelNotFoundEntity:
        channel = await connection.channel()  # the failed probe closed its channel
        queue = await channel.declare_queue(
            name, durable=True, arguments={"x-queue-type": "quorum"}
        )
    await queue.channel.set_qos(prefetch_count=50)
    return queue


async def run(args: argparse.Namespace) -> int:
    url = os.environ.get("GIN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    prefix = os.environ.get("GIN_PREFIX", "")
    notifier = Notifier(zone(args.tz))
    connection = await aio_pika.connect_robust(url)
    async with connection:
        queue = await own_queue(connection, prefix + args.queue)
        exchange = await queue.channel.get_exchange(prefix + EVENTS_EXCHANGE)
        await queue.bind(exchange, timer_key("*", "turn_reminder"))
        await queue.consume(notifier.on_message)
        print(f"listening on {prefix + args.queue}", file=sys.stderr, flush=True)
        while True:
            notifier.arrived.clear()
            try:
                await asyncio.wait_for(notifier.arrived.wait(), args.idle_exit)
            except TimeoutError:
                return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", default=QUEUE, help="the queue's name (unprefixed)")
    parser.add_argument("--tz", default=BRASILIA, help="the time zone times are told in")
    parser.add_argument(
        "--idle-exit", type=float, metavar="S", help="exit after S seconds with nothing new"
    )
    args = parser.parse_args()
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
