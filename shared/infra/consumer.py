"""One runner for every broker consumer: decode, log context, handle, settle.

Every service consumes the same way (the table's commands, the chat's and the timers' table
events, the bots' turns); only the decoder and the work differ. For each delivery:

1. **Decode** into the consumer's type. A body that is not one of ours (not JSON, the wrong
   shape) is **dead-lettered** with a log line: retrying it cannot help, and a person should
   look. A decoder raises ``Skip`` for a message it understood well enough to know it is not
   for it, say an event type of a newer contract: that is **acknowledged and skipped** with a
   log line, so a rolling deploy that adds an event type dead-letters nothing.
2. Bind the **log context** (``table_id``, ``command_id``, ...) for the work and its settling,
   and, tracing on, open the message's span (its ``traceparent`` header the parent).
3. **Work** (with ``in_transaction``, in one PostgreSQL transaction; what runs after the commit
   is given separately). Then settle:
   - done, or **refused** (one of the consumer's refusal types: a stale bot move, say), **ack**;
   - **transient** (``transient``: the database busy, away or restarting, SQLSTATE classes 08,
     53, 57, 40, timeouts, lost sockets, the broker's connection and channel errors): the
     message is held and the work **retried** with capped, jittered backoff until it is done,
     never dead-lettered. Held, not put back: a requeue would put it behind later messages of
     its table, and a quorum queue counts requeues towards its delivery limit (which
     dead-letters). If the message's channel closes meanwhile, the broker has taken it back to
     deliver again, so the runner lets go of it;
   - any other error (a bug, or a message no code can apply) is **dead-lettered**, logged with
     its traceback.

Delivery is ``serial`` (one message at a time, in delivery order: the chat and the timers
apply a table's events in order) or concurrent (each delivery as it comes, up to the
channel's prefetch: commands of different tables, bot turns).

Dead letters, retries and outcomes are counted (``ConsumerMetrics``): a dead letter is a
message a person must look at (runbook: GinDeadLetters).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

import aiormq.exceptions
import asyncpg
import msgspec
import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from prometheus_client import CollectorRegistry, Counter

from shared.contracts.compat import UnknownEvent, decode_envelope
from shared.contracts.envelope import Envelope
from shared.infra import db, tracing

log = structlog.get_logger()
T = TypeVar("T")
R = TypeVar("R")
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0


class Skip(Exception):
    """Raised by a decoder: the message is valid but not this consumer's to handle (an event
    type it does not know, from a newer contract). Acknowledged and skipped, with a log line."""


class Undecodable(Exception):
    """Raised by a decoder: the message is not one of ours. Dead-lettered."""


# What a decoder raises on a body that is not one of ours (RecursionError: JSON nested too
# deeply for msgspec). The runner dead-letters any other error of a decoder as well.
UNDECODABLE = (
    msgspec.DecodeError,
    msgspec.ValidationError,
    Undecodable,
    UnicodeDecodeError,
    RecursionError,
)


def transient(exc: BaseException) -> bool:
    """Whether the same work may succeed later: ``db.transient`` (the database busy, away or
    restarting; timeouts and lost sockets) or the broker's connection or channel failing."""
    return db.transient(exc) or isinstance(
        exc,
        aiormq.exceptions.AMQPConnectionError
        | aiormq.exceptions.AMQPChannelError
        | aiormq.exceptions.DeliveryError
        | aiormq.exceptions.ChannelInvalidStateError
        | ConnectionError,
    )


def backoff(attempt: int, first_s: float = RETRY_FIRST_S, max_s: float = RETRY_MAX_S) -> float:
    """The pause before retry ``attempt`` (0, 1, ...): doubling from ``first_s`` up to
    ``max_s``, with jitter so that held messages do not all come back at once."""
    return min(max_s, first_s * 2.0**attempt) * random.uniform(0.5, 1.0)


class ConsumerMetrics:
    """Messages by consumer and outcome, retries, and dead letters by reason; one per app."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = Counter(
            "gin_consumer_messages",
            "Messages settled by a consumer: handled, refused, skipped or dead_lettered",
            ["consumer", "outcome"],
            registry=registry,
        )
        self.retries = Counter(
            "gin_consumer_retries",
            "Retries of a message whose work failed transiently (database or broker away)",
            ["consumer"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            "gin_dead_lettered",
            "Messages a consumer sent to the dead-letter queue: undecodable, or failed",
            ["consumer", "reason"],
            registry=registry,
        )


def in_transaction(
    pool: asyncpg.Pool,
    apply: Callable[[db.Conn, T], Awaitable[R]],
    then: Callable[[T, R], Awaitable[None] | None] | None = None,
) -> Callable[[T], Awaitable[None]]:
    """Work that ``apply``s a message in one transaction, then (committed) calls ``then``
    with its result; ``then`` must not fail the message (it is committed)."""

    async def work(value: T) -> None:
        async with pool.acquire() as conn, conn.transaction():
            result = await apply(conn, value)
        if then is not None:
            done = then(value, result)
            if done is not None:
                await done

    return work


class Consumer(Generic[T]):
    """Runs one kind of message from one or more queues until ``stop``."""

    def __init__(
        self,
        name: str,
        decode: Callable[[bytes], T],
        work: Callable[[T], Awaitable[None]],
        metrics: ConsumerMetrics,
        *,
        context: Callable[[T], Mapping[str, object]] | None = None,
        refused: tuple[type[Exception], ...] = (),
        serial: bool = False,
    ) -> None:
        self.name = name
        self.decode = decode
        self.work = work
        self.metrics = metrics
        self.context = context
        self.refused = refused
        self.serial = serial
        self.stopping = asyncio.Event()
        self.inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self.in_hand: set[asyncio.Task[object]] = set()
        self.worker: asyncio.Task[None] | None = None
        self.consuming: list[tuple[AbstractQueue, str]] = []

    @property
    def idle(self) -> bool:
        """Nothing delivered is waiting here or being worked on."""
        return self.inbox.empty() and not self.in_hand

    async def start(self, queues: Sequence[AbstractQueue]) -> None:
        """Consume the queues (declared, on a channel with its prefetch set by the caller)."""
        if self.serial:
            self.worker = asyncio.create_task(self._work_in_order(), name=f"{self.name}-worker")
        for queue in queues:
            self.consuming.append((queue, await queue.consume(self._delivered)))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Take no more messages and let those in hand finish (``grace_s`` at most; a retry
        in progress lets go at once). What is left unsettled goes back to its queue when the
        channel closes."""
        self.stopping.set()
        for queue, tag in self.consuming:
            with contextlib.suppress(Exception):  # the broker may be away: nothing to cancel
                await queue.cancel(tag)
        if self.in_hand:
            _, running = await asyncio.wait(list(self.in_hand), timeout=grace_s)
            for task in running:
                task.cancel()
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker

    async def _delivered(self, message: AbstractIncomingMessage) -> None:
        # aio-pika runs each delivery's callback as a task of its own, in delivery order.
        if self.serial:
            self.inbox.put_nowait(message)
            return
        if self.stopping.is_set():
            return  # not settled: back to the queue with the channel
        await self._in_hand(message)

    async def _work_in_order(self) -> None:
        while not self.stopping.is_set():
            message = await self.inbox.get()
            await self._in_hand(message)

    async def _in_hand(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.in_hand.add(task)
        try:
            await self.handle(message)
        except Exception:  # never let one message stop the consumer
            log.exception("consumer_failed", consumer=self.name)
        finally:
            self.in_hand.discard(task)

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Decode, work and settle one message."""
        if _channel_closed(message):  # delivered again on the new channel: in order there
            log.info("message_let_go", consumer=self.name, reason="its channel closed")
            return
        try:
            value = self.decode(message.body)
        except Skip as exc:
            log.info("message_skipped", consumer=self.name, reason=str(exc))
            await self._settle(message, "skipped")
            return
        except Exception as exc:  # UNDECODABLE, or a decoder tripped by what it was given
            log.warning("message_undecodable", consumer=self.name, error=repr(exc))
            await self._dead_letter(message, "undecodable")
            return
        context = self.context(value) if self.context is not None else {}
        with (
            tracing.handling(self.name, message.headers),
            structlog.contextvars.bound_contextvars(**context),
        ):
            await self._work_and_settle(message, value)

    async def _work_and_settle(self, message: AbstractIncomingMessage, value: T) -> None:
        attempt = 0
        while True:
            try:
                await self.work(value)
            except self.refused as exc:
                log.info(
                    "message_refused",
                    consumer=self.name,
                    code=getattr(exc, "code", None),
                    error=str(exc),
                )
                await self._settle(message, "refused")
                return
            except Exception as exc:
                if not transient(exc):
                    log.exception("message_failed", consumer=self.name)
                    await self._dead_letter(message, "failed")
                    return
                if self.stopping.is_set() or _channel_closed(message):
                    log.warning("message_let_go", consumer=self.name, error=repr(exc))
                    return  # the broker delivers it again
                pause = backoff(attempt)
                log.warning(
                    "message_retry",
                    consumer=self.name,
                    error=repr(exc),
                    attempt=attempt + 1,
                    retry_in_s=round(pause, 3),
                )
                self.metrics.retries.labels(self.name).inc()
                attempt += 1
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self.stopping.wait()
                continue
            await self._settle(message, "handled")
            return

    async def _dead_letter(self, message: AbstractIncomingMessage, reason: str) -> None:
        self.metrics.dead_lettered.labels(self.name, reason).inc()
        await self._settle(message, "dead_lettered")

    async def _settle(self, message: AbstractIncomingMessage, outcome: str) -> None:
        """Ack (reject without requeue: dead-letter); a channel lost meanwhile means the
        broker delivers the message again, which every consumer here takes as a repeat."""
        self.metrics.messages.labels(self.name, outcome).inc()
        try:
            if outcome == "dead_lettered":
                await message.reject(requeue=False)
            else:
                await message.ack()
        except Exception as exc:
            log.warning("message_settle_failed", consumer=self.name, error=repr(exc))


def _channel_closed(message: AbstractIncomingMessage) -> bool:
    try:
        return bool(message.channel.is_closed)
    except Exception:  # aio-pika raises when the channel is gone
        return True


# --- table events -----------------------------------------------------------------------------


def decode_event(body: bytes) -> Envelope:
    """An event's envelope, read as the compatibility policy says (``shared.contracts.compat``:
    unknown fields ignored); ``Skip`` for a well-formed envelope of an event type or schema
    version this code does not know (a newer contract's), ``UNDECODABLE`` errors for anything
    else."""
    envelope = decode_envelope(body)
    if isinstance(envelope, UnknownEvent):
        raise Skip(
            f"unknown event type {envelope.type!r} (schema version {envelope.schema_version})"
        )
    return envelope


def event_context(envelope: Envelope) -> dict[str, object]:
    """What each log line of an event's handling carries."""
    return {"table_id": envelope.table_id, "seq": envelope.seq, "event_type": envelope.type}
