"""Commands from bots and the timer service, consumed from ``gin.commands``.

The same way in as HTTP (``Commands.handle``): a repeated ``command_id`` changes nothing, a stale
``expected_version`` is refused. The shared runner (``shared.infra.consumer``) settles each:
a refused command is acknowledged (a bot's stale move after the human resigned is normal),
an undecodable one is dead-lettered, and a database outage holds the command until it is
applied. Commands are applied concurrently (each locks its own table's row).
"""

from __future__ import annotations

import structlog
from aio_pika.abc import AbstractRobustConnection

from services.table.decide import Actor, Rejected
from services.table.handling import Commands
from shared.contracts.api import QueuedCommand
from shared.contracts.compat import UnknownCommand, decode_queued_command
from shared.contracts.names import COMMANDS_QUEUE
from shared.engine import IllegalAction
from shared.infra.consumer import Consumer, ConsumerMetrics, Skip
from shared.infra.web import Refused

log = structlog.get_logger()


def decode_command(body: bytes) -> QueuedCommand:
    """A queued command, unknown fields ignored; ``Skip`` for a command type of a newer
    contract (``shared.contracts.compat``)."""
    queued = decode_queued_command(body)
    if isinstance(queued, UnknownCommand):
        raise Skip(f"unknown command type {queued.type!r} from {queued.source}")
    return queued


class CommandConsumer:
    """Applies queued commands through ``Commands.handle``, as HTTP does."""

    def __init__(self, commands: Commands, prefix: str, metrics: ConsumerMetrics) -> None:
        self.commands = commands
        self.prefix = prefix
        self.runner = Consumer(
            "table_commands",
            decode_command,
            self.apply,
            metrics,
            context=lambda q: {"table_id": q.table_id, "command_id": q.command.command_id},
            refused=(Rejected, Refused, IllegalAction),
        )

    async def start(self, connection: AbstractRobustConnection, prefetch: int = 16) -> None:
        """Start consuming (competing consumers: any number of replicas)."""
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        await self.runner.start([await channel.get_queue(self.prefix + COMMANDS_QUEUE)])

    async def stop(self) -> None:
        """Take no more commands; let those in hand commit (or go back to the queue)."""
        await self.runner.stop()

    async def apply(self, queued: QueuedCommand) -> None:
        """Apply one queued command (a repeat answers its first result and changes nothing);
        its change is handed to the relay and this replica's sockets once committed."""
        actor = Actor(kind=queued.source, seat=queued.seat)
        handled = await self.commands.handle(actor, queued.table_id, queued.command)
        outcome = "queued_command_applied" if handled.change else "queued_command_repeated"
        log.info(outcome, source=queued.source, type=type(queued.command).__name__)
