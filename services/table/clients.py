"""One table WebSocket as the hub holds it: its bounded queue of frames, its writer, its close.

Nothing here waits on a client. Each socket has a bounded queue of encoded frames and its own
writer task; queueing a frame never blocks, and a client whose queue is full is closed with
``CLOSE_TOO_SLOW`` (it reconnects and resumes by seq). Every close is bounded in time: a peer
that does not read has its transport aborted, which frees what was buffered for it.

These are the parts of a socket that know nothing of tables or the broker, so the hub
(``hub.py``) and the route (``sockets.py``) share them without importing each other.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import structlog
from aiohttp import WSCloseCode, WSMsgType, web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.infra.auth import Identity
from shared.infra.ops import count_buckets

log = structlog.get_logger()

# The close codes of the table socket (documented in docs/openapi.yaml and asyncapi.yaml).
CLOSE_GOING_AWAY = int(WSCloseCode.GOING_AWAY)  # 1001: this replica stops; reconnect elsewhere
CLOSE_MESSAGE_TOO_BIG = int(WSCloseCode.MESSAGE_TOO_BIG)  # 1009: aiohttp's, past max_msg_size
# 1013: the replica is full (no file to spare, GIN_MAX_SOCKETS held, or its memory near its
# limit); reconnect in a while.
CLOSE_TRY_AGAIN_LATER = int(WSCloseCode.TRY_AGAIN_LATER)
CLOSE_TOKEN_EXPIRED = 4001  # the token's exp (plus the leeway) passed: reconnect with a new one
CLOSE_TOO_SLOW = 4008  # the client fell past its send queue: reconnect and resume by seq
CLOSE_ARCHIVED = 4410  # the table was archived: GET /v1/tables/{id} answers 410 and says where
GOING_AWAY_REASON = "server shutting down"
TRY_AGAIN_REASON = "server full: reconnect in a few seconds"
TOKEN_EXPIRED_REASON = "token expired: reconnect with a fresh token"
ARCHIVED_REASON = "table archived: GET /v1/tables/{id} says where its record is"
# A close reason has at most 123 bytes (RFC 6455 5.5), so it names the route, not the table.
TOO_SLOW_REASON = "too slow: reconnect, then GET /v1/tables/{id}/events?after=<last seq>"
# A peer that has stopped reading never answers the close handshake, nor takes the close
# frame: past this the transport is aborted.
CLOSE_TIMEOUT_S = 2.0
# The writer waits for the transport (which pauses past 64 KiB) after each this many bytes;
# aiohttp's default, 256 KiB, would buffer a whole match in the transport, past the queue's
# bound. With this a socket holds at most about 64 + 16 KiB and a frame in its transport.
WRITER_LIMIT_BYTES = 16 * 1024


@dataclass(eq=False)
class Client:
    """One open WebSocket at one table, with its queue of frames not yet written."""

    ws: web.WebSocketResponse
    identity: Identity | None
    table_id: str
    frames: asyncio.Queue[bytes]
    transport: asyncio.Transport | None = None
    deck_design: str | None = None
    ready: bool = False  # the snapshot is queued: events may follow
    last_seq: int = 0  # the newest table event queued for it
    last_chat_seq: int = 0
    # The feed may have missed its table's chat or timer notices since its snapshot (bound
    # late, or the channel reopened): it is sent one again after its next whole catch-up.
    missed: bool = False
    notices: set[uuid.UUID] = field(default_factory=set)  # timer events sent (by envelope id)
    queued_bytes: int = 0
    gone: bool = False  # dropped or released: nothing more is queued for it
    writing: bool = False  # its writer is in the middle of a frame
    writer: asyncio.Task[None] | None = None
    closing: asyncio.Task[None] | None = None
    expiry: asyncio.TimerHandle | None = None


class SocketMetrics:
    """Open sockets, how full their send queues run, those closed as too slow, and those
    refused for want of files."""

    def __init__(self, registry: CollectorRegistry, bound: int) -> None:
        self.open_sockets = Gauge(
            "gin_websockets",
            "Open WebSockets (tables' and players') on this replica",
            registry=registry,
        )
        self.queue_depth = Histogram(
            "gin_websocket_send_queue_depth",
            "Frames in a socket's send queue, seen as each frame is queued",
            registry=registry,
            buckets=count_buckets(bound),
        )
        self.queued_bytes = Gauge(
            "gin_websocket_queued_bytes",
            "Bytes of frames queued for this replica's sockets, not yet written",
            registry=registry,
        )
        self.too_slow = Counter(
            "gin_websockets_too_slow",
            f"Sockets closed with {CLOSE_TOO_SLOW}: their send queue was full",
            registry=registry,
        )
        self.refused = Counter(
            "gin_websockets_refused",
            f"New WebSockets closed at once with {CLOSE_TRY_AGAIN_LATER}: reason files, the"
            " process had more files open (process_open_fds) than its limit (process_max_fds)"
            " less GIN_FILES_RESERVE; reason sockets, the replica held GIN_MAX_SOCKETS;"
            " reason memory, its memory in use passed GIN_MEMORY_FULL_SHARE of its limit",
            ["reason"],
            registry=registry,
        )


def queue_frame(client: Client, frame: bytes, metrics: SocketMetrics) -> bool:
    """Queue one frame for the client's writer, never waiting; False if its queue is full
    (the client is too slow: the caller closes it)."""
    try:
        client.frames.put_nowait(frame)
    except asyncio.QueueFull:
        return False
    client.queued_bytes += len(frame)
    metrics.queued_bytes.inc(len(frame))
    metrics.queue_depth.observe(client.frames.qsize())
    return True


async def write_frames(client: Client, metrics: SocketMetrics) -> None:
    """The client's writer: its frames in order, at the pace its peer reads them."""
    while not client.gone:
        frame = await client.frames.get()
        client.queued_bytes -= len(frame)
        metrics.queued_bytes.dec(len(frame))
        client.writing = True
        try:
            await client.ws.send_frame(frame, WSMsgType.TEXT)
        except Exception as exc:  # the peer went (or worse): its handler releases it
            if not isinstance(exc, ConnectionError | RuntimeError):
                log.exception("ws_write_failed", table_id=client.table_id)
            client.gone = True
            discard_frames(client, metrics)
        finally:
            client.writing = False


def discard_frames(client: Client, metrics: SocketMetrics) -> None:
    """Empty the client's queue, its bytes no longer counted."""
    while not client.frames.empty():
        client.frames.get_nowait()
    metrics.queued_bytes.dec(client.queued_bytes)
    client.queued_bytes = 0


async def close_socket(client: Client, code: int, reason: str) -> None:
    """Close a client's socket with ``code``, within ``CLOSE_TIMEOUT_S``: a peer that does
    not read takes neither the close frame nor the handshake, so its transport is aborted,
    which frees what was buffered for it."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await client.ws.close(code=code, message=reason.encode())
    except TimeoutError:
        log.info("ws_close_timed_out", table_id=client.table_id, code=code)
        if client.transport is not None:
            client.transport.abort()
        return
    except Exception as exc:  # the transport is gone already: nothing left to free
        log.info("ws_close_failed", table_id=client.table_id, code=code, error=repr(exc))
    abort_if_stuck(client.transport)


def abort_if_stuck(transport: asyncio.Transport | None) -> None:
    """A closed socket's transport that still holds unsent bytes waits on a peer that does
    not read: abort it rather than keep the bytes."""
    if transport is not None and transport.get_write_buffer_size() > 0:
        transport.abort()
