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


async def run(args: argparse.Namespace) -> int:
    url = os.environ.get("GIN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    prefix = os.environ.get("GIN_PREFIX", "")
    dedupe, turns = Dedupe(), Turns()
    out = sys.stdout.buffer
    arrived = asyncio.Event()
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=200)  # a stream needs a prefetch
        name = prefix + (args.queue or HISTORY_STREAM)
        try:
            queue = await channel.get_queue(name)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            print(
                f"no queue {name!r} on {url.split('@')[-1]} (is GIN_PREFIX right?)", file=sys.stderr
            )
            return 1
        # Our own queue: from where it is. The stream: from the offset asked for.
        consume_arguments: dict[str, Any] = {} if args.queue else {"x-stream-offset": offset(args)}

        async def on_message(message: AbstractIncomingMessage) -> None:
            arrived.set()
            try:
                envelope = decode_envelope(message.body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                print(f"not an event ({exc}): skipped", file=sys.stderr)
                await message.ack()
                return
            if dedupe.first_time(envelope):
                if args.turns:
                    if isinstance(envelope, Envelope) and envelope.stream == "table":
                        change = turns.apply(envelope)
                        if change is not None:
                            out.write(_json.encode(change) + b"\n")
                else:  # the envelope as published (unknown fields kept), on one line
                    out.write(_json.encode(msgspec.json.decode(message.body)) + b"\n")
                out.flush()
            await message.ack()

        await queue.consume(on_message, arguments=consume_arguments)
        while True:  # until interrupted, or --idle-exit seconds without a message
            arrived.clear()
            try:
                async with asyncio.timeout(args.idle_exit):
                    await arrived.wait()
            except TimeoutError:
                break
    if args.turns:
        out.write(_json.encode({"waiting_on": turns.waiting_on()}) + b"\n")
        out.flush()
    return 0


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
