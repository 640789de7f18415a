"""What leans on private internals of our libraries, in one place, with the versions it was
tested on.

Speed-ups reach inside three libraries: ``FairPool`` overrides asyncpg's ``Pool._acquire``
(and subclasses its ``PoolAcquireContext``, to see how an acquired block ended);
``publish_confirmed`` keeps aiormq's channel books (delivery tags, confirmations, the writer's
queue) itself; ``SharedDeflateResponse`` overrides aiohttp's WebSocket handshake and writer,
so that one compressed frame serves every table socket; and ``shared/infra/serving.py``'s
``HeadDeadline``, the one part kept apart, overrides aiohttp's request handler so that a
request's head is read under a deadline. None is a public API, so a new release may change
them without notice. ``pyproject.toml`` bounds these libraries to
``TESTED`` (a test holds the two in step), and ``check_versions`` refuses to start a service
on any other version, with one line naming the library, instead of failing later on a
player's move. Moving to a new version: run ``tests/infra/test_fair_pool.py``,
``tests/infra/test_publish_confirmed.py``, ``tests/table/test_deflate.py`` and
``tests/infra/test_slow_clients.py`` against it, then widen the bounds together.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, NamedTuple

import aiormq
import aiormq.abc
import asyncpg
import asyncpg.pool
from aiohttp import WSMsgType, hdrs, web
from aiohttp._websocket.writer import WebSocketWriter
from aiohttp.base_protocol import BaseProtocol
from aiohttp.client_exceptions import ClientConnectionResetError
from aiohttp.web_request import BaseRequest
from multidict import CIMultiDict
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

# distribution: (lowest tested, first untested), as in pyproject.toml's dependencies.
TESTED: dict[str, tuple[str, str]] = {
    "asyncpg": ("0.32", "0.33"),
    "aiormq": ("7.2", "7.3"),
    "aiohttp": ("3.14", "3.15"),
}


class UntestedVersion(RuntimeError):
    """A library this module reaches inside of is at a version it was not tested with."""


def _numbers(version: str) -> tuple[int, ...]:
    """``"0.32.0rc1"`` -> ``(0, 32, 0)``: the leading numeric release parts."""
    parts: list[int] = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(part):  # 0rc1: a pre-release of that number
            break
    return tuple(parts)


def untested(
    versions: Callable[[str], str] = metadata.version,
    tested: dict[str, tuple[str, str]] = TESTED,
) -> list[str]:
    """A line for each bounded library installed at a version outside its tested range."""
    lines = []
    for name, (low, high) in tested.items():
        installed = versions(name)
        if not _numbers(low) <= _numbers(installed) < _numbers(high):
            lines.append(
                f"{name} {installed} is not a version shared/infra/internals.py was tested with"
                f" (>={low},<{high})"
            )
    return lines


def check_versions() -> None:
    """Raise ``UntestedVersion`` naming each library outside its tested range."""
    lines = untested()
    if lines:
        raise UntestedVersion("; ".join(lines))


# --- asyncpg ----------------------------------------------------------------------------------


class PoolExhausted(TimeoutError):
    """Every connection stayed busy for the whole acquire timeout."""


# A server that refuses writes (a demoted primary, now a standby, or one set read-only):
# every connection of the pool is on it, since a pool connects to one primary at a time.
READ_ONLY_SQL_TRANSACTION = "25006"


def refuses_writes(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the server the connection is on no longer takes writes."""
    return isinstance(exc, asyncpg.PostgresError) and exc.sqlstate == READ_ONLY_SQL_TRANSACTION


class _AcquireContext(asyncpg.pool.PoolAcquireContext):
    """asyncpg's ``async with pool.acquire()``, which also sees how the block ended: a
    connection on a server that refuses writes expires the whole pool (the connections in
    use close as they come back, the idle ones before their next use, and each new one
    finds the current primary: ``target_session_attrs=read-write``)."""

    __slots__ = ()

    async def __aexit__(self, *exc_info: Any) -> None:
        if refuses_writes(exc_info[1]):
            await self.pool.expire_connections()
        await super().__aexit__(*exc_info)


class FairPool(asyncpg.Pool):
    """asyncpg's pool, handing connections out first come, first served.

    asyncpg's pool is an asyncio.Queue of connections, and a queue lets a newcomer take an
    item put back for a waiter that has not run yet; the waiter then goes to the back of the
    line. A saturated table service starved some players that way (some matches of a round
    made far fewer moves than others). A semaphore as large as the pool, which wakes
    its waiters in order and lets no one past them, now decides who gets the next connection.
    """

    def __init__(
        self,
        *args: Any,
        acquire_timeout_s: float | None = None,
        on_wait: Callable[[float], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._turns = asyncio.Semaphore(kwargs["max_size"])
        self._acquire_timeout_s = acquire_timeout_s
        self._on_wait = on_wait  # told how long each acquire waited for its turn (seconds)

    async def _acquire(self, timeout: float | None) -> Any:  # noqa: ASYNC109 (asyncpg.Pool's)
        """A connection in turn; PoolExhausted when none came within the timeout (the
        caller's, else the pool's): a request then answers 503 instead of waiting unbounded."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout or self._acquire_timeout_s):
                await self._turns.acquire()
                if self._on_wait is not None:
                    self._on_wait(time.perf_counter() - started)
                try:
                    return await super()._acquire(None)  # type: ignore[misc]
                except BaseException:
                    self._turns.release()
                    raise
        except TimeoutError as exc:
            if self._on_wait is not None:
                self._on_wait(time.perf_counter() - started)
            raise PoolExhausted("no database connection came free in time") from exc

    def acquire(self, *, timeout: float | None = None) -> Any:
        """asyncpg's acquire, dropping the pool's connections after a write was refused."""
        return _AcquireContext(self, timeout)

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        try:
            await super().release(connection, timeout=timeout)
        finally:
            self._turns.release()


# --- aiormq -----------------------------------------------------------------------------------


class Outgoing(NamedTuple):
    """One message of a batch for ``publish_confirmed``."""

    exchange: str
    routing_key: str
    body: bytes
    properties: Basic.Properties


async def publish_confirmed(
    channel: aiormq.abc.AbstractChannel, messages: Sequence[Outgoing]
) -> None:
    """Publish messages in order on a channel with publisher confirms, in one socket write,
    and return once the broker confirmed every one (``aiormq.exceptions.DeliveryError`` on a
    nack; the channel's error if it closes first). The caller sets the timeout.

    aiormq's ``basic_publish`` takes the channel's lock and waits for the socket write for
    each message, so a batch went out one message per event-loop turn: a busy table service
    relayed far fewer events than it committed moves, and spent much CPU on each. This
    keeps aiormq's own books (delivery tags, confirmation futures, the writer's queue) under
    the same lock, once per batch, so it mixes with ``basic_publish`` on one channel. It
    relies on aiormq 7.2's channel internals; tests/infra/test_publish_confirmed.py holds
    them to it (order, confirms, a nack, a body split into frames, tags in step).
    """
    if not isinstance(channel, aiormq.Channel):
        raise TypeError(f"publish_confirmed needs an aiormq.Channel, not {channel!r}")
    if not messages:
        return
    confirmations: list[asyncio.Future[object]] = []
    async with channel.lock:
        before = channel.delivery_tag
        size = channel.max_content_size
        frames: list[Basic.Publish | ContentHeader | ContentBody] = []
        for message in messages:
            channel.delivery_tag += 1
            confirmation = channel.create_future()
            channel.confirmations[channel.delivery_tag] = confirmation
            confirmations.append(confirmation)
            body = message.body
            frames.append(Basic.Publish(exchange=message.exchange, routing_key=message.routing_key))
            frames.append(ContentHeader(properties=message.properties, body_size=len(body)))
            frames += (ContentBody(body[i : i + size]) for i in range(0, len(body), size))
        written = channel.create_future()
        try:
            await channel.write_queue.put(
                aiormq.abc.ChannelFrame.marshall(channel.number, frames, written)
            )
        except BaseException:  # nothing went out: the broker must not miss the tags
            for tag in range(before + 1, channel.delivery_tag + 1):
                channel.confirmations.pop(tag, None)
            channel.delivery_tag = before
            for confirmation in confirmations:
                confirmation.cancel()
            raise
        await written
    await asyncio.gather(*confirmations)


# --- aiohttp ----------------------------------------------------------------------------------

# The one answer the table gives an offer of permessage-deflate: no context taken over either
# way (RFC 7692 7.1.1.1 and 7.1.1.2 let a server add both to any offer it accepts).
SHARED_DEFLATE = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"


class SharedDeflateResponse(web.WebSocketResponse):
    """A WebSocket that, when its client offers permessage-deflate, negotiates no context
    takeover either way and sends each data frame as ``deflate(frame, window_bits)`` gives
    it: compressed bytes made once for every socket that sends the frame (None: plain).

    aiohttp's own answer keeps the server's context, so each socket would hold a compressor
    and compress every frame for itself. This overrides ``WebSocketResponse._handshake``
    (its answer) and ``_pre_start`` (its writer); the reader is aiohttp's, which inflates
    what the client compresses."""

    def __init__(self, *, deflate: Callable[[bytes, int], bytes | None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._deflate = deflate

    def _handshake(self, request: BaseRequest) -> tuple[CIMultiDict[str], str | None, int, bool]:
        headers, protocol, window_bits, _ = super()._handshake(request)
        if window_bits:  # accepted: a window below 15 is one the client asked the server for
            answer = SHARED_DEFLATE
            if window_bits < 15:
                answer += f"; server_max_window_bits={window_bits}"
            headers[hdrs.SEC_WEBSOCKET_EXTENSIONS] = answer
        return headers, protocol, window_bits, True

    def _pre_start(self, request: BaseRequest) -> tuple[str | None, WebSocketWriter]:
        protocol, writer = super()._pre_start(request)
        window_bits = writer.compress
        if not window_bits:
            return protocol, writer
        deflate = self._deflate
        shared = _SharedDeflateWriter(
            writer.protocol,
            writer.transport,
            limit=writer._limit,
            deflate=lambda frame: deflate(frame, window_bits),
        )
        return protocol, shared


class _SharedDeflateWriter(WebSocketWriter):
    """aiohttp's writer with no compressor of its own: a data frame is written compressed
    (RSV1 set) when ``deflate`` gives its bytes, else plain; control frames as ever."""

    def __init__(
        self,
        protocol: BaseProtocol,
        transport: asyncio.Transport,
        *,
        limit: int,
        deflate: Callable[[bytes], bytes | None],
    ) -> None:
        super().__init__(protocol, transport, limit=limit)  # compress=0: never its own
        self._deflate_frame = deflate

    async def send_frame(self, message: bytes, opcode: int, compress: int | None = None) -> None:
        payload = self._deflate_frame(message) if opcode < WSMsgType.CLOSE else None
        if payload is None:
            await super().send_frame(message, opcode)
            return
        if self._closing:
            raise ClientConnectionResetError("Cannot write to closing transport")
        self._write_websocket_frame(payload, opcode, _RSV1)
        # The flow control of WebSocketWriter.send_frame: wait for the transport past the limit.
        if self._output_size > self._limit:
            self._output_size = 0
            if self.protocol._paused:
                await self.protocol._drain_helper()


_RSV1 = 0x40  # a compressed message (RFC 7692 6)
