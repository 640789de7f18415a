#!/usr/bin/env python3
"""An example subscriber of Selminha Gin's game events (docs/subscribing.md).

It needs only the contracts (``pip install selminha-gin-contracts``, i.e. msgspec) and
aio-pika. Settings: ``GIN_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``) and
``GIN_PREFIX`` (default empty: the prefix of every exchange and queue name).

    python examples/subscriber.py --from-start --idle-exit 5
        every kept event of the history stream, from its first, one envelope a JSON line;
        exits after 5 s with nothing new
    python examples/subscriber.py --since 2026-12-01T00:00:00Z
        from a moment on (the stream's timestamps: a little before is possible)
    python examples/subscriber.py --turns --from-start
        a per-player "whose turn is it" projection: a JSON line each time a turn passes to
        someone (or to nobody), and at exit the tables waiting on each player
    python examples/subscriber.py --queue gin.sub.notifier
        the same, from your team's own queue (deploy/k8s/components/subscriber) instead

``GIN_AMQP_URL`` may name several broker nodes (``amqp://user:password@h1:5672,h2:5672/vhost``):
when its node goes, the subscriber connects to the next and reads the stream on from the offset
after the last message it processed (docs/subscribing.md, "When the connection drops").

Delivery is at least once: events are deduplicated by their position
``(stream, table_id, seq)`` (the envelope's ``id`` says the same). Event types this code does
not know (a newer contract) are skipped, unknown fields ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import Any

import aio_pika
import msgspec
from aio_pika.abc import AbstractIncomingMessage

from shared.contracts import events as e
from shared.contracts.compat import UnknownEvent, decode_envelope
from shared.contracts.envelope import Envelope
from shared.contracts.names import HISTORY_STREAM

Position = tuple[str, str, int]
_json = msgspec.json.Encoder()


class Dedupe:
    """Positions seen; per stream of each table, the last seq applied (older ones are repeats:
    each stream is in order)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], int] = {}

    def first_time(self, envelope: Envelope | UnknownEvent) -> bool:
        """Whether this event was not seen before (and note it)."""
        key = (envelope.stream, envelope.table_id)
        if envelope.seq <= self.last.get(key, 0):
            return False
        self.last[key] = envelope.seq
        return True


class Turns:
    """Whose decision it is at each table, from the public events alone."""

    def __init__(self) -> None:
        self.seats: dict[str, list[e.Player | None]] = {}
        self.to_act: dict[str, int | None] = {}

    def apply(self, envelope: Envelope) -> dict[str, Any] | None:
        """Apply one table event; the change of turn it makes (None: no change)."""
        table_id, event = envelope.table_id, envelope.data
        seats = self.seats.setdefault(table_id, [None, None])
        before = self.to_act.get(table_id)
        after = before
        match event:
            case e.TableCreated(creator=creator):
                seats[0] = creator
            case e.SeatTaken(seat=seat, player=player) if seat in (0, 1):
                seats[seat] = player
            case e.HandStarted(dealer=dealer):
                after = 1 - dealer  # the non-dealer decides on the upcard first
            case e.UpcardPassed(seat=seat) | e.CardDiscarded(seat=seat):
                after = 1 - seat
            case e.UpcardTaken(seat=seat) | e.CardDrawn(seat=seat):
                after = seat  # the same seat goes on: it must discard
            case e.HandEnded() | e.MatchEnded() | e.TableClosed() | e.TableExpired():
                after = None
            case _:
                return None
        self.to_act[table_id] = after
        if after == before:
            return None
        who = None if after is None else seats[after]
        return {
            "table_id": table_id,
            "seat": after,
            "player": None if who is None else (who.id or f"bot:{who.bot}"),
            "name": None if who is None else who.name,
            "since": envelope.occurred_at,
        }

    def waiting_on(self) -> dict[str, list[str]]:
        """Per player, the tables where it is their decision now."""
        out: dict[str, list[str]] = {}
        for table_id, seat in self.to_act.items():
            player = None if seat is None else self.seats[table_id][seat]
            if player is not None:
                out.setdefault(player.id or f"bot:{player.bot}", []).append(table_id)
        return out


def offset(args: argparse.Namespace) -> object:
    """Where to start reading the stream (its ``x-stream-offset``)."""
    if args.from_start:
        return "first"
    if args.since is not None:
        return datetime.fromisoformat(args.since.replace("Z", "+00:00")).astimezone(UTC)
    return "next"


def addresses(url: str) -> list[str]:
    """Each broker node's URL: ``GIN_AMQP_URL`` names one, or several as
    ``amqp://user:password@host1:5672,host2:5672/vhost``."""
    scheme, _, rest = url.partition("://")
    userinfo, at, hosts_and_path = rest.rpartition("@")
    cut = min((i for i in map(hosts_and_path.find, "/?#") if i >= 0), default=len(hosts_and_path))
    hosts, tail = hosts_and_path[:cut], hosts_and_path[cut:]
    return [f"{scheme}://{userinfo}{at}{host.strip()}{tail}" for host in hosts.split(",")]


class Reader:
    """Consumes the stream (or a queue of yours) on one node, and again on the next after
    that node goes, from the offset after the last message it processed: given the offset
    it first asked for, a reconnect would read everything again ("first") or miss what came
    meanwhile ("next"), so each new consumer asks for the last offset seen plus one."""

    def __init__(self, args: argparse.Namespace, url: str, prefix: str) -> None:
        self.args = args
        self.nodes = addresses(url)
        self.name = prefix + (args.queue or HISTORY_STREAM)
        self.start: object = offset(args)  # where the next consumer starts (the stream)
        self.dedupe, self.turns = Dedupe(), Turns()
        self.out = sys.stdout.buffer
        self.arrived = asyncio.Event()

    async def run(self) -> int:
        """Read until interrupted, or ``--idle-exit`` seconds without a message."""
        node = 0
        while True:
            url = self.nodes[node % len(self.nodes)]
            node += 1
            try:
                connection = await aio_pika.connect(url, timeout=10)
            except (OSError, TimeoutError, aio_pika.exceptions.AMQPConnectionError) as exc:
                print(f"{url.split('@')[-1]}: {exc!r}; trying the next node", file=sys.stderr)
                await asyncio.sleep(1 if node % len(self.nodes) else 5)
                continue
            lost = asyncio.Event()
            connection.close_callbacks.add(lambda *_, lost=lost: lost.set())
            try:
                async with connection:
                    done = await self.read(connection, lost)
            except aio_pika.exceptions.AMQPError as exc:
                # Such as PRECONDITION_FAILED "does not have a replica on the local node":
                # the stream's replicas restart for a few seconds after a node goes.
                print(f"{url.split('@')[-1]}: {exc!r}; trying the next node", file=sys.stderr)
                await asyncio.sleep(1)
                continue
            if done is not None:
                return done
            print(f"{url.split('@')[-1]} went away; resuming on the next node", file=sys.stderr)

    async def read(
        self, connection: aio_pika.abc.AbstractConnection, lost: asyncio.Event
    ) -> int | None:
        """Consume on one connection; the exit status when done, None when it was lost."""
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=200)  # a stream needs a prefetch
        try:
            queue = await channel.get_queue(self.name)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            print(f"no queue {self.name!r} (is GIN_PREFIX right?)", file=sys.stderr)
            return 1
        # Our own queue: from where it is. The stream: from the offset asked for, then on.
        arguments: dict[str, Any] = {} if self.args.queue else {"x-stream-offset": self.start}
        await queue.consume(self.on_message, arguments=arguments)
        while not lost.is_set():
            self.arrived.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self.arrived, lost)]
            try:
                finished, _ = await asyncio.wait(
                    waits, timeout=self.args.idle_exit, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for wait in waits:
                    wait.cancel()
            if not finished:  # --idle-exit seconds without a message
                self.summary()
                return 0
        return None

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Print an event the first time it comes; remember the stream offset after it."""
        self.arrived.set()
        try:
            envelope = decode_envelope(message.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            print(f"not an event ({exc}): skipped", file=sys.stderr)
        else:
            if self.dedupe.first_time(envelope):
                self.show(envelope, message.body)
        await message.ack()
        stream_offset = (message.headers or {}).get("x-stream-offset")
        if isinstance(stream_offset, int):
            self.start = stream_offset + 1

    def show(self, envelope: Envelope | UnknownEvent, body: bytes) -> None:
        if self.args.turns:
            if isinstance(envelope, Envelope) and envelope.stream == "table":
                change = self.turns.apply(envelope)
                if change is not None:
                    self.out.write(_json.encode(change) + b"\n")
        else:  # the envelope as published (unknown fields kept), on one line
            self.out.write(_json.encode(msgspec.json.decode(body)) + b"\n")
        self.out.flush()

    def summary(self) -> None:
        if self.args.turns:
            self.out.write(_json.encode({"waiting_on": self.turns.waiting_on()}) + b"\n")
            self.out.flush()


async def run(args: argparse.Namespace) -> int:
    url = os.environ.get("GIN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    return await Reader(args, url, os.environ.get("GIN_PREFIX", "")).run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-start", action="store_true", help="from the first kept event")
    start.add_argument("--since", help="from this moment (RFC 3339), e.g. 2026-12-01T00:00:00Z")
    parser.add_argument("--queue", help="read your own queue (unprefixed name) instead")
    parser.add_argument("--turns", action="store_true", help="whose turn it is, per player")
    parser.add_argument(
        "--idle-exit", type=float, metavar="S", help="exit after S seconds with nothing new"
    )
    args = parser.parse_args()
    if args.queue and (args.from_start or args.since):
        parser.error("--from-start and --since read the history stream, not a queue")
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
