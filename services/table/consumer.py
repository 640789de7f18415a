"""Commands from bots and the timer service, consumed from ``gin.commands``.

Same checks as HTTP (``Tables.command``): a repeated ``command_id`` changes nothing, a stale
``expected_version`` is refused. A refused command is acknowledged (a bot's stale move after
the human resigned is normal); an undecodable one is dead-lettered; a database outage puts
the message back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import msgspec
import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from services.table.store import Change
from services.table.tables import Actor, Tables
from shared.contracts.api import QueuedCommand
from shared.contracts.names import COMMANDS_QUEUE
from shared.engine import IllegalAction
from shared.infra import db
from shared.infra.web import Refused

log = structlog.get_logger()
_decoder = msgspec.json.Decoder(QueuedCommand)
RETRY_PAUSE_S = 1.0


class CommandConsumer:
    """Applies queued commands with the table service's own checks."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        tables: Tables,
        prefix: str,
        committed: Callable[[Change], Awaitable[None]],
    ) -> None:
        self.pool = pool
        self.tables = tables
        self.prefix = prefix
        self.committed = committed

    async def start(self, connection: AbstractRobustConnection, prefetch: int = 16) -> None:
        """Start consuming (competing consumers: any number of replicas)."""
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.get_queue(self.prefix + COMMANDS_QUEUE)
        await queue.consume(self.on_message)

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Apply one queued command, then settle the message."""
        try:
            queued = _decoder.decode(message.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("queued_command_undecodable", error=str(exc))
            await message.reject(requeue=False)
            return
        structlog.contextvars.bind_contextvars(
            table_id=queued.table_id, command_id=queued.command.command_id
        )
        actor = Actor(kind=queued.source, seat=queued.seat)
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                _, change = await self.tables.command(conn, queued.table_id, actor, queued.command)
            if change is not None:
                await self.committed(change)
            outcome = "queued_command_applied" if change else "queued_command_repeated"
            log.info(outcome, source=queued.source, type=type(queued.command).__name__)
        except (Refused, IllegalAction) as exc:
            log.info("queued_command_refused", source=queued.source, code=getattr(exc, "code", ""))
        except Exception as exc:
            if db.transient(exc):  # the database is busy or away: never dead-letter a move
                log.warning("queued_command_retry", error=repr(exc))
                await asyncio.sleep(RETRY_PAUSE_S)
                await message.nack(requeue=True)
                return
            log.exception("queued_command_failed")
            await message.reject(requeue=False)
            return
        finally:
            structlog.contextvars.unbind_contextvars("table_id", "command_id")
        await message.ack()
