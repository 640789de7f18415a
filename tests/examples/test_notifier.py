"""examples/notifier.py against the real RabbitMQ (issue 33, part 2): it prints, in Brazilian
Portuguese, the message for each ``turn_reminder`` published on ``gin.events``, once per
reminder, and its own durable queue keeps what is published while it is stopped."""

from __future__ import annotations

import asyncio
import doctest
import importlib.util
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
import msgspec

from shared.contracts.envelope import Envelope
from shared.contracts.events import TurnReminder
from shared.contracts.names import timer_key
from shared.infra.settings import Settings
from tests.chat.test_durability import publish as publish_events
from tests.table.conftest import Api

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "notifier.py"
IDLE_S = 2
SINCE = datetime(2026, 12, 5, 18, 2, tzinfo=UTC)


def reminder(table_id: str, kind: str, after_s: float, seq: int) -> bytes:
    """A ``turn_reminder`` envelope as the timer service publishes it."""
    envelope = Envelope(
        id=uuid.uuid4(),
        type="turn_reminder",
        table_id=table_id,
        stream="timer",
        seq=seq,
        occurred_at=SINCE + timedelta(seconds=after_s),
        data=TurnReminder(
            seat=1,
            since=SINCE,
            waited_s=after_s + 0.2,
            claimable_at=SINCE + timedelta(hours=48),
            reminder="claimable" if kind == "claimable" else "waiting",
            after_s=after_s,
            table_seq=4,
        ),
    )
    return msgspec.json.encode(envelope)


class NotifierProcess:
    """``examples/notifier.py`` on a queue of this test's, to its idle exit."""

    def __init__(self, settings: Settings, queue: str) -> None:
        self.settings = settings
        self.queue = queue
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {
            **os.environ,
            "GIN_AMQP_URL": self.settings.amqp_url,
            "GIN_PREFIX": self.settings.prefix,
            "PYTHONPATH": str(ROOT),  # these contracts, not an installed copy
        }
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLE),
            "--queue",
            self.queue,
            "--idle-exit",
            str(IDLE_S),
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.process.stderr is not None
        async with asyncio.timeout(30):  # its queue is bound: what is published now is kept
            while not (line := await self.process.stderr.readline()).startswith(b"listening"):
                assert line, "the notifier exited before it listened"

    async def printed(self) -> list[str]:
        """Its stdout lines, once it has exited (idle)."""
        assert self.process is not None
        assert self.process.stdout is not None
        async with asyncio.timeout(60):
            out = await self.process.stdout.read()
            err = await self.process.stderr.read() if self.process.stderr else b""
            assert await self.process.wait() == 0, err.decode()
        return out.decode().splitlines()


async def publish(settings: Settings, table_id: str, *bodies: bytes) -> None:
    """Publish reminders of a table as the timer service's relay would."""
    await publish_events(settings, *bodies, routing_key=timer_key(table_id, "turn_reminder"))


async def test_prints_each_reminder_once_in_portuguese(api: Api, settings: Settings) -> None:
    queue = f"gin.notifier.test-{uuid.uuid4().hex[:8]}"
    table_id = f"ntf-{uuid.uuid4().hex[:6]}"
    notifier = NotifierProcess(settings, queue)
    await notifier.start()
    first = reminder(table_id, "waiting", 86400.0, 1)
    # published twice (at least once delivery): told once
    await publish(settings, table_id, first, first, reminder(table_id, "claimable", 172800.0, 3))
    assert await notifier.printed() == [
        f"mesa {table_id}, assento 1: Sua vez na mesa {table_id} há 24 h; a partir de 07/12"
        " às 15:02 (horário de Brasília) o adversário pode reivindicar a partida.",
        f"mesa {table_id}, assento 1: Sua vez na mesa {table_id} há 48 h; o adversário já pode"
        " reivindicar a partida por ausência.",
    ]

    # Stopped: its queue keeps what is published meanwhile, and tells it on the next start.
    await publish(settings, table_id, reminder(table_id, "waiting", 158400.0, 2))
    again = NotifierProcess(settings, queue)
    await again.start()
    assert await again.printed() == [
        f"mesa {table_id}, assento 1: Sua vez na mesa {table_id} há 44 h; a partir de 07/12"
        " às 15:02 (horário de Brasília) o adversário pode reivindicar a partida.",
    ]
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        await (await connection.channel()).queue_delete(settings.prefix + queue)


def test_the_examples_doctests() -> None:

    spec = importlib.util.spec_from_file_location("notifier", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0


async def test_uses_a_queue_made_for_the_team_as_it_is(api: Api, settings: Settings) -> None:
    """In production deploy/k8s/components/subscriber makes the team's queue, with its own
    arguments (a dead-letter exchange): the notifier reads it without declaring it again."""
    queue = f"gin.sub.ntf{uuid.uuid4().hex[:6]}.queue"
    table_id = f"ntf-{uuid.uuid4().hex[:6]}"
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(
            settings.prefix + queue,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-dead-letter-exchange": "gin.nowhere"},
        )
        notifier = NotifierProcess(settings, queue)
        await notifier.start()
        await publish(settings, table_id, reminder(table_id, "claimable", 172800.0, 3))
        assert await notifier.printed() == [
            f"mesa {table_id}, assento 1: Sua vez na mesa {table_id} há 48 h; o adversário já"
            " pode reivindicar a partida por ausência.",
        ]
        await channel.queue_delete(settings.prefix + queue)
