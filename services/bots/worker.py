"""The bot worker: consumes bot turns, decides with a pure strategy, sends the command back.

Competing consumers on the ``gin.bots.<level>`` queues (any number of replicas), manual
acks, settled by the shared runner (``shared.infra.consumer``). A turn carries the bot seat's
own view and nothing more (R11.4). The command carries ``command_id`` and
``expected_version`` derived from the turn, so a redelivered, resent or stale turn makes no
second move. A message that cannot be decided goes to the dead-letter queue; a broker that
does not confirm the command holds the turn until it does.

A decision is pure CPU work (LUNA's can take a few hundred milliseconds), so it runs on a
thread of the worker's own, one turn at a time: the event loop stays free for the broker's
heartbeats and confirms, the next turn's publish, and the health probes Kubernetes times.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import aio_pika
import msgspec
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.bots.strategies.knowledge import NoDecision
from shared.contracts import commands as c
from shared.contracts.api import BotTurn, QueuedCommand
from shared.contracts.commands import AnyCommand
from shared.contracts.compat import decode_bot_turn
from shared.contracts.names import COMMANDS_EXCHANGE, COMMANDS_QUEUE, bot_queue
from shared.contracts.views import TableView
from shared.infra import tracing
from shared.infra.consumer import Consumer, ConsumerMetrics, Undecodable

log = structlog.get_logger()
Strategy = Callable[[TableView, random.Random], c.Command]
_json = msgspec.json.Encoder()


class BotMetrics:
    """Decisions by level and outcome, and how long deciding took."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "gin_bot_decisions", "Bot decisions", ["level", "outcome"], registry=registry
        )
        self.seconds = Histogram(
            "gin_bot_decision_seconds",
            "Time a strategy took to decide",
            ["level"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )


def turn_rng(turn: BotTurn) -> random.Random:
    """The randomness of one turn: seeded by table and version, so a turn replays the same."""
    return random.Random(f"{turn.table_id}:{turn.version}:{turn.seat}")


def decide(strategy: Strategy, turn: BotTurn) -> c.Command:
    """The strategy's command for this turn, made safe to repeat (id and expected version)."""
    command = strategy(turn.view, turn_rng(turn))
    return msgspec.structs.replace(
        command, command_id=command_id_of(turn), expected_version=turn.version
    )


def timed_decision(strategy: Strategy, turn: BotTurn) -> tuple[c.Command, float]:
    """``decide``, with the seconds it took (measured on the deciding thread, so a turn
    waiting for the one before it is not counted)."""
    started = time.perf_counter()
    command = decide(strategy, turn)
    return command, time.perf_counter() - started


def command_id_of(turn: BotTurn) -> str:
    """The id of the bot's command for this turn: the same however often the turn comes."""
    return f"bot:{turn.table_id}:{turn.version}:{turn.seat}"


def turn_context(turn: BotTurn) -> dict[str, object]:
    """What each log line of a turn's handling carries."""
    return {"table_id": turn.table_id, "version": turn.version, "command_id": command_id_of(turn)}


class BotWorker:
    """Consumes the bot queues of the given levels."""

    def __init__(
        self,
        strategies: Mapping[str, Strategy],
        prefix: str,
        think_s: float,
        metrics: BotMetrics,
        consumer_metrics: ConsumerMetrics,
    ) -> None:
        self.strategies = strategies
        self.prefix = prefix
        self.think_s = think_s
        self.metrics = metrics
        self.channel: AbstractChannel | None = None
        self.commands: AbstractExchange | None = None
        # Its thread starts with the first decision and ends with ``stop``.
        self.deciding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bot-decide")
        self.runner = Consumer(
            "bot_turns",
            self.decode,
            self.on_turn,
            consumer_metrics,
            context=turn_context,
            refused=(NoDecision,),
        )

    async def start(self, connection: aio_pika.abc.AbstractRobustConnection, prefetch: int) -> None:
        """Consume every level's queue on one channel with publisher confirms."""
        self.channel = await connection.channel(publisher_confirms=True)
        await self.channel.set_qos(prefetch_count=prefetch)
        # Declared by the table service: the bots' broker user may only write it.
        self.commands = await self.channel.get_exchange(
            self.prefix + COMMANDS_EXCHANGE, ensure=False
        )
        queues = [
            await self.channel.get_queue(self.prefix + bot_queue(level))
            for level in self.strategies
        ]
        await self.runner.start(queues)

    async def stop(self) -> None:
        """Take no more turns; let those in hand be sent (or go back to their queue)."""
        await self.runner.stop()
        self.deciding.shutdown(wait=False, cancel_futures=True)  # one cut off by the grace

    def decode(self, body: bytes) -> BotTurn:
        """A turn of a level this worker plays (else it is undecodable here)."""
        turn = decode_bot_turn(body)  # its view's legal read leniently (a newer contract)
        if turn.level not in self.strategies:
            raise Undecodable(f"no strategy for the level {turn.level!r}")
        return turn

    async def on_turn(self, turn: BotTurn) -> None:
        """Decide one turn and send the command (the runner acknowledges the turn after)."""
        loop = asyncio.get_running_loop()
        strategy = self.strategies[turn.level]
        try:
            command, seconds = await loop.run_in_executor(
                self.deciding, timed_decision, strategy, turn
            )
            self.metrics.seconds.labels(turn.level).observe(seconds)
        except NoDecision:  # nothing is the bot's to decide in that view (a stale turn)
            self.metrics.decisions.labels(turn.level, "none").inc()
            raise
        except Exception:
            self.metrics.decisions.labels(turn.level, "failed").inc()
            raise
        if self.think_s > 0:
            await asyncio.sleep(self.think_s)  # a person can follow the bot's moves
        await self.send(turn, command)
        self.metrics.decisions.labels(turn.level, "sent").inc()

    async def send(self, turn: BotTurn, command: c.Command) -> None:
        """Put the command on ``gin.commands`` (through ``gin.commands.in``) and wait for the
        broker's confirm."""
        assert self.commands is not None
        queued = cast(AnyCommand, command)
        body = QueuedCommand(table_id=turn.table_id, source="bot", seat=turn.seat, command=queued)
        await self.commands.publish(
            aio_pika.Message(
                _json.encode(body),
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=command.command_id,
                headers=tracing.headers(),  # the table's handling continues the turn's trace
            ),
            routing_key=self.prefix + COMMANDS_QUEUE,
        )
