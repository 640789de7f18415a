"""The table WebSocket: a snapshot on connect, then every event with the viewer's new view.

Each replica has one exclusive queue, so it works with any number of replicas. A replica
delivers its own commits to its clients without the broker hop: the command hands the change
to the hub's inbox and answers at once; the hub's task delivers it after the response. Every
table event reaches every replica's queue from ``gin.sockets``, one message per relay batch;
a replica sends on those of the tables its clients watch that it has not sent yet (another
replica committed them). Chat and timer events come from ``gin.events``, bound for the tables
its clients watch. Events come at least once and in order per table; a client is sent each
seq once, and a gap (a lost message, a reconnect) is filled from the table's event log before
the next event goes out.

Nothing here waits on a client. Each socket has a bounded queue of encoded frames and its own
writer task; queueing a frame never blocks, and a client whose queue is full is closed with
``CLOSE_TOO_SLOW`` (it reconnects and resumes by seq). Every close is bounded in time: a peer
that does not read has its transport aborted, which frees what was buffered for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field

import asyncpg
import msgspec
import structlog
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    AbstractRobustConnection,
)
from aiohttp import WSCloseCode, WSMessage, WSMsgType, web
from aiormq.abc import DeliveredMessage
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.table import store
from services.table.http import (
    TABLES,
    counted_command,
    identity_of,
    limit,
    refusal_of,
    run_command,
)
from services.table.store import Change, TableRow
from services.table.tables import Tables
from shared.contracts.api import ErrorDetail, WsCommand, WsError, WsEvent, WsSnapshot
from shared.contracts.compat import decode_envelope
from shared.contracts.envelope import Envelope, envelope_decoder
from shared.contracts.names import EVENTS_EXCHANGE, SOCKETS_EXCHANGE
from shared.contracts.views import TableView
from shared.infra.auth import AuthError, Identity
from shared.infra.files import FileBudget
from shared.infra.ops import count_buckets
from shared.infra.service import POOL, SETTINGS

log = structlog.get_logger()
_json = msgspec.json.Encoder()
_ws_command = msgspec.json.Decoder(WsCommand)
GAP_FILL_LIMIT = 1000
# A table whose catch-up failed (the database away) is caught up again after this long,
# doubling up to the most, until one succeeds.
RETRY_FIRST_S = 0.2
RETRY_MOST_S = 5.0
# A bind waits this long at most for the broker (a robust channel waits for its connection).
BIND_TIMEOUT_S = 2.0

# The close codes of the table socket (documented in docs/openapi.yaml and asyncapi.yaml).
CLOSE_GOING_AWAY = int(WSCloseCode.GOING_AWAY)  # 1001: this replica stops; reconnect elsewhere
CLOSE_MESSAGE_TOO_BIG = int(WSCloseCode.MESSAGE_TOO_BIG)  # 1009: aiohttp's, past max_msg_size
# 1013: the replica is full (no file to spare, or GIN_MAX_SOCKETS held); reconnect in a while.
CLOSE_TRY_AGAIN_LATER = int(WSCloseCode.TRY_AGAIN_LATER)
CLOSE_TOKEN_EXPIRED = 4001  # the token's exp (plus the leeway) passed: reconnect with a new one
CLOSE_TOO_SLOW = 4008  # the client fell past its send queue: reconnect and resume by seq
GOING_AWAY_REASON = "server shutting down"
TRY_AGAIN_REASON = "server full: reconnect in a few seconds"
TOKEN_EXPIRED_REASON = "token expired: reconnect with a fresh token"
# A close reason has at most 123 bytes (RFC 6455 5.5), so it names the route, not the table.
TOO_SLOW_REASON = "too slow: reconnect, then GET /v1/tables/{id}/events?after=<last seq>"
# A peer that has stopped reading never answers the close handshake, nor takes the close
# frame: past this the transport is aborted.
CLOSE_TIMEOUT_S = 2.0
# The writer waits for the transport (which pauses past 64 KiB) after each this many bytes;
# aiohttp's default, 256 KiB, would buffer a whole match in the transport, past the queue's
# bound. With this a socket holds at most about 64 + 16 KiB and a frame in its transport.
WRITER_LIMIT_BYTES = 16 * 1024

ViewKey = tuple[int | None, str | None]  # (seat, deck design): who sees the same view


class _Head(msgspec.Struct):
    """Where an event belongs: enough to skip one this replica has sent already."""

    table_id: str
    seq: int


_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_head_decoder = msgspec.json.Decoder(_Head)


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
            "gin_websockets", "Open table WebSockets on this replica", registry=registry
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
            " less GIN_FILES_RESERVE; reason sockets, the replica held GIN_MAX_SOCKETS",
            ["reason"],
            registry=registry,
        )


class Hub:
    """This replica's WebSocket clients, by table, fed from its own queue and its commits."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        tables: Tables,
        prefix: str,
        registry: CollectorRegistry,
        send_queue: int = 256,
    ) -> None:
        self.pool = pool
        self.tables = tables
        self.prefix = prefix
        self.send_queue = send_queue
        self.clients: dict[str, set[Client]] = {}
        self.sockets = 0  # the clients of every table: what GIN_MAX_SOCKETS bounds
        self.channel: AbstractChannel | None = None
        self.queue: AbstractQueue | None = None
        self.exchange: AbstractExchange | None = None
        self.batches = prefix + SOCKETS_EXCHANGE
        self.metrics = SocketMetrics(registry, send_queue)
        self.metrics.open_sockets.set_function(lambda: self.sockets)  # one count, read at scrape
        # This replica's commits, in commit order: delivered by one task, off the request.
        # Unbounded: it fills no faster than the database commits, and its task never waits
        # on a socket (only on the rare gap fill's read).
        self.inbox: asyncio.Queue[Change] = asyncio.Queue()
        # Of each table with a change in the inbox: the newest seq of those changes. A relay
        # batch can come back before the inbox is delivered; its events up to that seq are
        # left to the inbox, which has the row and the views (the batch's catch-up would read
        # the table and its log again, for nothing).
        self.coming: dict[str, int] = {}
        self.task: asyncio.Task[None] | None = None
        self.closing: set[asyncio.Task[None]] = set()
        # Of each watched table: the newest row this replica has (its own commits, its reads)
        # and the newest seq it has heard of (also other replicas' batches). A new socket's
        # snapshot comes from the row, not the database, while no newer seq was heard; and a
        # spectator's snapshot frame is encoded once per version and design.
        self.latest: dict[str, TableRow] = {}
        self.heard: dict[str, int] = {}
        self.snapshots: dict[tuple[str, str | None], tuple[int, bytes]] = {}
        # Watched tables whose catch-up failed: the batch that told of their events is gone
        # (the queue is consumed without acks), so they are caught up from the log again.
        self.behind: set[str] = set()
        # Watched tables whose chat and timer keys are not bound: the broker's channel was
        # away when their first watcher came. Bound by the same task, and the socket served.
        self.unbound: set[str] = set()
        self.retrying: asyncio.Task[None] | None = None

    async def start(self, connection: AbstractRobustConnection) -> None:
        """Open this replica's queue and consume; start delivering this replica's commits."""
        self.channel = await connection.channel()
        await self.channel.set_qos(prefetch_count=256)
        self.exchange = await self.channel.get_exchange(self.prefix + EVENTS_EXCHANGE)
        # Named here, not by aio-pika (amq_...): gin.sockets.<32 hex digits>, this replica's,
        # is the only name of its kind the table's broker user may configure in production.
        self.queue = await self.channel.declare_queue(
            f"{self.batches}.{uuid.uuid4().hex}", exclusive=True, auto_delete=True
        )
        await self.queue.bind(self.batches)
        await self._consume()
        connection.reconnect_callbacks.add(self._on_reconnect)
        self.task = asyncio.get_running_loop().create_task(self._deliver_commits(), name="ws-hub")

    async def stop(self) -> None:
        """Stop the delivery tasks and wait for the closes under way (each is bounded)."""
        for task in (self.task, self.retrying):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.gather(*self.closing, return_exceptions=True)

    async def _consume(self) -> None:
        """Consume on the channel's aiormq channel, without acks: this queue dies with the
        replica, and a lost event is refilled from the log. (aio-pika's message object for each
        delivery cost more than the delivery itself.) aio-pika restores the queue and its
        bindings after a reconnect, but not a consumer it did not make: ``_on_reconnect``
        consumes again."""
        assert self.channel is not None
        assert self.queue is not None
        channel = await self.channel.get_underlay_channel()
        await channel.basic_consume(self.queue.name, self._on_delivery, no_ack=True)

    # --- clients ------------------------------------------------------------------------------

    async def open(
        self,
        table_id: str,
        ws: web.WebSocketResponse,
        identity: Identity | None,
        transport: asyncio.Transport | None = None,
    ) -> Client:
        """A client for a prepared socket, with its queue and writer, watching its table."""
        client = Client(
            ws=ws,
            identity=identity,
            table_id=table_id,
            frames=asyncio.Queue(maxsize=self.send_queue),
            transport=transport,
        )
        client.writer = asyncio.get_running_loop().create_task(self._write(client))
        await self.attach(table_id, client)
        return client

    async def attach(self, table_id: str, client: Client) -> None:
        """Watch a table: bind before the snapshot, so nothing after it is missed."""
        watchers = self.clients.setdefault(table_id, set())
        first = not watchers
        watchers.add(client)
        self.sockets += 1
        if not first:
            return
        try:
            await self._bind(table_id)
        except Exception as exc:  # the broker's channel is away: bind when it is back
            log.warning("ws_bind_failed", table_id=table_id, error=repr(exc))
            self.unbound.add(table_id)
            self._retry()

    async def _bind(self, table_id: str) -> None:
        """Hear a table's chat and timer events on this replica's queue."""
        if self.queue is None or self.exchange is None:
            return
        async with asyncio.timeout(BIND_TIMEOUT_S):
            for key in watched_keys(table_id):
                await self.queue.bind(self.exchange, key)

    def _remove(self, client: Client) -> bool:
        """Take a client off its table (once); True if that was the table's last watcher."""
        watchers = self.clients.get(client.table_id)
        if watchers is None or client not in watchers:
            return False
        watchers.discard(client)
        self.sockets -= 1
        if watchers:
            return False
        del self.clients[client.table_id]
        self.unbound.discard(client.table_id)
        self.latest.pop(client.table_id, None)
        self.heard.pop(client.table_id, None)
        for key in [k for k in self.snapshots if k[0] == client.table_id]:
            del self.snapshots[key]
        return True

    # --- what this replica knows of its watched tables ---------------------------------------

    def remember(self, row: TableRow) -> None:
        """A table's row as committed (read or written here), kept while it is watched and
        no newer seq has been heard of."""
        table_id = row.table_id
        if table_id in self.clients and row.seq >= self.heard.get(table_id, 0):
            self.latest[table_id] = row
            self.heard[table_id] = row.seq

    def hear(self, table_id: str, seq: int) -> None:
        """A table event exists up to ``seq``: a row older than that is no longer current."""
        if seq > self.heard.get(table_id, 0) and table_id in self.clients:
            self.heard[table_id] = seq
            row = self.latest.get(table_id)
            if row is not None and row.seq < seq:
                del self.latest[table_id]

    def current(self, table_id: str) -> TableRow | None:
        """The newest row of a watched table, if this replica has it."""
        return self.latest.get(table_id)

    def snapshot_frame(self, row: TableRow, seat: int | None, design: str | None) -> bytes:
        """A ``WsSnapshot`` of the row for this viewer; a spectator's is encoded once per
        version and deck design (views of a seat carry legal moves of the moment)."""
        if seat is not None:
            return _json.encode(WsSnapshot(view=self.tables.table_view(row, seat, design)))
        key = (row.table_id, design)
        kept = self.snapshots.get(key)
        if kept is not None and kept[0] == row.version:
            return kept[1]
        frame = _json.encode(WsSnapshot(view=self.tables.table_view(row, None, design)))
        if row.table_id in self.clients:
            self.snapshots[key] = (row.version, frame)
        return frame

    async def _unbind(self, table_id: str) -> None:
        """Stop hearing a table nobody here watches now (unless someone came back)."""
        if self.queue is None or self.exchange is None:
            return
        with contextlib.suppress(Exception):  # the broker may be away; no harm
            for key in watched_keys(table_id):
                if table_id in self.clients:
                    return
                await self.queue.unbind(self.exchange, key)

    def _forget(self, client: Client) -> bool:
        """Queue nothing more for a client and free what it holds; True if it was the last
        watcher of its table."""
        client.gone = True
        if client.expiry is not None:
            client.expiry.cancel()
        # A writer waiting for a frame is cancelled. One in the middle of a frame is left to
        # finish it (it sees ``gone`` and stops): it waits on aiohttp's one drain future of
        # the connection, which the close waits on too, and a cancel would cancel the close.
        if client.writer is not None and not client.writing:
            client.writer.cancel()
        self._discard_frames(client)
        return self._remove(client)

    def _discard_frames(self, client: Client) -> None:
        while not client.frames.empty():
            client.frames.get_nowait()
        self.metrics.queued_bytes.dec(client.queued_bytes)
        client.queued_bytes = 0

    async def release(self, client: Client) -> None:
        """The socket's handler is done: the client is forgotten, its transport freed."""
        if self._forget(client):
            await self._unbind(client.table_id)
        if client.closing is None and client.ws.closed:
            _abort_if_stuck(client.transport)

    def drop(self, client: Client, code: int, reason: str) -> None:
        """Close a client with ``code`` in the background (bounded); it is forgotten now."""
        if client.closing is not None:
            return
        last = self._forget(client)
        task = asyncio.get_running_loop().create_task(self._close(client, code, reason, last))
        client.closing = task
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)

    async def _close(self, client: Client, code: int, reason: str, last: bool) -> None:
        await close_socket(client, code, reason)
        if last:
            await self._unbind(client.table_id)

    def expire_at(self, client: Client, when: float | None) -> None:
        """Close the client with ``CLOSE_TOKEN_EXPIRED`` at ``when`` (unix seconds)."""
        if when is None:
            return
        delay = max(0.0, when - time.time())  # the wall clock, as the token's ``exp`` is
        client.expiry = asyncio.get_running_loop().call_later(
            delay, self.drop, client, CLOSE_TOKEN_EXPIRED, TOKEN_EXPIRED_REASON
        )

    async def close_all(self) -> None:
        """Close every socket with 1001 (going away): clients reconnect to another replica."""
        for watchers in list(self.clients.values()):
            for client in list(watchers):
                self.drop(client, CLOSE_GOING_AWAY, GOING_AWAY_REASON)
        await asyncio.gather(*self.closing, return_exceptions=True)

    def send(self, client: Client, frame: bytes) -> None:
        """Queue one text frame of JSON (UTF-8) for a client, in order; never waits. A
        client whose queue is full is closed as too slow."""
        if client.gone:
            return
        try:
            client.frames.put_nowait(frame)
        except asyncio.QueueFull:
            self.metrics.too_slow.inc()
            log.info("ws_client_too_slow", table_id=client.table_id, last_seq=client.last_seq)
            self.drop(client, CLOSE_TOO_SLOW, TOO_SLOW_REASON)
            return
        client.queued_bytes += len(frame)
        self.metrics.queued_bytes.inc(len(frame))
        self.metrics.queue_depth.observe(client.frames.qsize())

    async def _write(self, client: Client) -> None:
        """The client's writer: its frames in order, at the pace its peer reads them."""
        while not client.gone:
            frame = await client.frames.get()
            client.queued_bytes -= len(frame)
            self.metrics.queued_bytes.dec(len(frame))
            client.writing = True
            try:
                await client.ws.send_frame(frame, WSMsgType.TEXT)
            except Exception as exc:  # the peer went (or worse): its handler releases it
                if not isinstance(exc, ConnectionError | RuntimeError):
                    log.exception("ws_write_failed", table_id=client.table_id)
                client.gone = True
                self._discard_frames(client)
            finally:
                client.writing = False

    # --- deliveries -----------------------------------------------------------------------

    def committed(self, change: Change) -> None:
        """A change this replica just committed: delivered after the command's answer."""
        if change.envelopes and change.row.table_id in self.clients:
            self.coming[change.row.table_id] = change.row.seq
            self.inbox.put_nowait(change)

    async def _deliver_commits(self) -> None:
        """One task for the inbox, so each table's commits go out in commit order; a failed
        delivery is logged (its clients get the gap filled with the next event)."""
        while True:
            change = await self.inbox.get()
            table_id = change.row.table_id
            try:
                await self.deliver_local(change)
            except Exception:
                log.exception("ws_delivery_failed", table_id=table_id)
                self.retry_later(table_id)
            finally:
                if self.coming.get(table_id) == change.row.seq:
                    del self.coming[table_id]

    async def _on_delivery(self, message: DeliveredMessage) -> None:
        try:
            if message.exchange == self.batches:
                await self.deliver_batch(message.body)
            else:  # chat and timer events; a newer contract's type is skipped (compat)
                envelope = decode_envelope(message.body)
                if isinstance(envelope, Envelope):
                    await self.deliver(envelope)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ws_event_undecodable", error=str(exc))

    def _on_reconnect(self, *_: object) -> None:
        asyncio.get_running_loop().create_task(self.resync())

    async def resync(self) -> None:
        """After a broker reconnect: consume again, then send every client what it may have
        missed."""
        try:
            await self._consume()
        except Exception as exc:  # the connection dropped again: the next reconnect retries
            log.warning("ws_consume_failed", error=repr(exc))
            return
        for table_id in list(self.clients):
            await self.catch_up_or_retry(table_id, [])

    async def deliver_batch(self, body: bytes) -> None:
        """A relay batch of table events (a JSON array of envelopes, of any tables): send on
        those this replica's clients were not sent yet, each table's in one catch-up."""
        behind: dict[str, list[Envelope]] = {}
        for raw in _batch_decoder.decode(body):
            head = _head_decoder.decode(raw)
            if head.seq <= self.coming.get(head.table_id, 0):
                continue  # this replica's own commit, on its way from the inbox
            self.hear(head.table_id, head.seq)
            watchers = self.clients.get(head.table_id)
            if watchers and any(c.ready and c.last_seq < head.seq for c in watchers):
                behind.setdefault(head.table_id, []).append(envelope_decoder.decode(raw))
        for table_id, burst in behind.items():
            await self.catch_up_or_retry(table_id, burst)

    async def catch_up_or_retry(self, table_id: str, burst: list[Envelope]) -> None:
        """``catch_up``; one that fails (the database away) is retried until it succeeds."""
        try:
            await self.catch_up(table_id, burst)
        except Exception as exc:
            log.warning("ws_catch_up_failed", table_id=table_id, error=repr(exc))
            self.retry_later(table_id)

    def retry_later(self, table_id: str) -> None:
        """Catch a table's clients up from its log later, with a bounded backoff."""
        self.behind.add(table_id)
        self._retry()

    def _retry(self) -> None:
        if self.retrying is None or self.retrying.done():
            self.retrying = asyncio.get_running_loop().create_task(
                self._retry_behind(), name="ws-hub-retry"
            )

    async def _retry_behind(self) -> None:
        """Bind the tables ``unbound`` and catch up those ``behind`` until none is left: a
        catch-up without a burst reads every event past each client's ``last_seq``, so no
        seq a failed one missed is lost, and none is sent twice."""
        wait = RETRY_FIRST_S
        while self.behind or self.unbound:
            await asyncio.sleep(wait)
            failed = False
            for table_id in list(self.unbound):
                try:
                    await self._bind(table_id)
                except Exception as exc:
                    log.warning("ws_bind_failed", table_id=table_id, error=repr(exc))
                    failed = True
                    continue
                self.unbound.discard(table_id)
                if table_id not in self.clients:  # its last watcher left meanwhile
                    await self._unbind(table_id)
            for table_id in list(self.behind):
                self.behind.discard(table_id)  # a table unwatched meanwhile: nothing to do
                try:
                    await self.catch_up(table_id, [])
                except Exception as exc:
                    log.warning("ws_catch_up_failed", table_id=table_id, error=repr(exc))
                    self.behind.add(table_id)
                    failed = True
            wait = min(wait * 2, RETRY_MOST_S) if failed else RETRY_FIRST_S

    async def deliver(self, envelope: Envelope) -> None:
        """An event from ``gin.events`` (chat, timers): send it to every client at its table
        not sent it yet (one frame, shared)."""
        watchers = [c for c in self.clients.get(envelope.table_id, ()) if c.ready]
        if not watchers:
            return
        frame = _json.encode(WsEvent(event=envelope))
        if envelope.type == "message_posted":
            for client in watchers:
                if envelope.seq > client.last_chat_seq:
                    client.last_chat_seq = envelope.seq
                    self.send(client, frame)
        elif envelope.type == "absence_claimable":  # from the timers: its own numbering
            for client in watchers:
                if envelope.id not in client.notices:
                    client.notices.add(envelope.id)
                    self.send(client, frame)

    async def deliver_local(self, change: Change) -> None:
        """A change this replica committed: its clients get it without the broker hop."""
        row = change.row
        self.remember(row)
        if row.table_id in self.clients and change.envelopes:
            await self.catch_up(row.table_id, change.envelopes, row, dict(change.views))

    async def catch_up(
        self,
        table_id: str,
        burst: list[Envelope],
        row: TableRow | None = None,
        views: dict[ViewKey, TableView] | None = None,
    ) -> None:
        """Send each client its unsent events up to the newest of ``burst`` (or all), each
        with the viewer's view; the table's log fills any gap, in seq order.

        Only the reads await; the sending is one synchronous pass, so two catch-ups of one
        table (the hub's and a new socket's) interleave only between whole passes, and
        ``last_seq`` keeps each client's seqs once and in order."""
        watchers = [c for c in self.clients.get(table_id, ()) if c.ready]
        if not watchers:
            return
        oldest = min(c.last_seq for c in watchers)
        have = {e.seq for e in burst}
        upto = max(have) if have else None
        gap = upto is None or any(q not in have for q in range(oldest + 1, upto + 1))
        missed: list[Envelope] = []
        if gap or row is None:
            async with self.pool.acquire() as conn:
                if row is None:
                    row = await store.read_table(conn, table_id)
                    if row is not None:
                        self.remember(row)
                if gap and row is not None:
                    raw = await store.events_after(conn, table_id, oldest, GAP_FILL_LIMIT)
                    missed = [envelope_decoder.decode(r) for r in raw]
        if row is None:
            return
        upto = row.seq if upto is None else upto
        events = {e.seq: e for e in missed if e.seq <= upto}
        events.update((e.seq, e) for e in burst)
        self._send_events(table_id, row, events, {} if views is None else views)

    def _send_events(
        self,
        table_id: str,
        row: TableRow,
        events: dict[int, Envelope],
        views: dict[ViewKey, TableView],
    ) -> None:
        """Queue each ready client the events past its ``last_seq``. Each event and each
        view is encoded once, and each (event, view) frame once, shared by every client
        that sees that view (the spectators share one)."""
        encoded_events: dict[int, bytes] = {}
        encoded_views: dict[ViewKey, bytes] = {}
        frames: dict[tuple[int, ViewKey], bytes] = {}
        order = sorted(events)
        for client in [c for c in self.clients.get(table_id, ()) if c.ready]:
            seat = row.seat_of(client.identity.id if client.identity else None)
            key = (seat, client.deck_design)
            for seq in order:
                if seq <= client.last_seq:
                    continue
                frame = frames.get((seq, key))
                if frame is None:
                    if key not in encoded_views:
                        view = views.get(key)
                        if view is None:
                            view = self.tables.table_view(row, seat, client.deck_design)
                        encoded_views[key] = _json.encode(view)
                    if seq not in encoded_events:
                        encoded_events[seq] = _json.encode(events[seq])
                    frame = event_frame(encoded_events[seq], encoded_views[key])
                    frames[(seq, key)] = frame
                client.last_seq = seq
                self.send(client, frame)


def event_frame(event: bytes, view: bytes) -> bytes:
    """A ``WsEvent`` from its event and view already encoded (as msgspec would write it)."""
    return b'{"kind":"event","event":' + event + b',"view":' + view + b"}"


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
    _abort_if_stuck(client.transport)


def _abort_if_stuck(transport: asyncio.Transport | None) -> None:
    """A closed socket's transport that still holds unsent bytes waits on a peer that does
    not read: abort it rather than keep the bytes."""
    if transport is not None and transport.get_write_buffer_size() > 0:
        transport.abort()


HUB = web.AppKey("hub", Hub)
FILES = web.AppKey("files", FileBudget)


def watched_keys(table_id: str) -> tuple[str, ...]:
    """The routing keys on ``gin.events`` of what a table's sockets receive besides its
    events (those come from ``gin.sockets``): chat and timers."""
    return (f"chat.{table_id}.*", f"timer.{table_id}.*")


def closes_at(identity: Identity | None, leeway_s: float) -> float | None:
    """When a socket of this identity must close: its token's ``exp`` plus the leeway the
    verifier allows (unix seconds); None without a token."""
    if identity is None or identity.expires_at is None:
        return None
    return identity.expires_at + leeway_s


async def table_socket(request: web.Request) -> web.StreamResponse:
    """``GET /v1/tables/{id}/ws``: watch a table; a seated client may also send commands."""
    full = _full(request)  # first: a refusal reads nothing, counts nothing
    if full is not None:
        return await _refuse_socket(request, full)
    table_id = request.match_info["id"]
    identity = identity_of(request, required=False, query_token=True)
    if identity is not None:  # watchers without a token are many and nameless: not counted
        await limit(request, "sockets", identity)
    tables = request.app[TABLES]
    hub = request.app[HUB]
    # A table this replica has seen full, or has the row of, exists for good.
    if table_id not in tables.seatings and hub.current(table_id) is None:
        async with request.app[POOL].acquire() as conn:
            await tables.seating(conn, table_id)  # 404 if there is none
    settings = request.app[SETTINGS]
    # Past max_msg_size aiohttp closes the socket with 1009 (CLOSE_MESSAGE_TOO_BIG).
    ws = web.WebSocketResponse(
        heartbeat=30.0, max_msg_size=settings.ws_max_frame_bytes, writer_limit=WRITER_LIMIT_BYTES
    )
    await ws.prepare(request)
    client = await hub.open(table_id, ws, identity, request.transport)
    hub.expire_at(client, closes_at(identity, settings.auth_leeway_s))
    try:
        if await _snapshot(request, client, table_id):
            await hub.catch_up(table_id, [])  # anything committed while the row was read
        async for msg in ws:
            await _on_message(request, client, msg)
    finally:
        await hub.release(client)
    return ws


def _full(request: web.Request) -> str | None:
    """Why this replica takes no more sockets ("files", "sockets"), or None if it does."""
    if not request.app[FILES].admits():
        return "files"
    if request.app[HUB].sockets >= request.app[SETTINGS].max_sockets:
        return "sockets"
    return None


async def _refuse_socket(request: web.Request, reason: str) -> web.WebSocketResponse:
    """Open the socket only to close it with 1013 and a reason: a browser's WebSocket is
    told nothing of an upgrade refused over HTTP (a 503 is a 1006 to the page, as a
    network cut is). The close is bounded as every close is."""
    ws = web.WebSocketResponse(timeout=CLOSE_TIMEOUT_S)
    await ws.prepare(request)  # a plain GET, not an upgrade, is refused with 400 here
    request.app[HUB].metrics.refused.labels(reason).inc()
    await ws.close(code=CLOSE_TRY_AGAIN_LATER, message=TRY_AGAIN_REASON.encode())
    return ws


async def _snapshot(request: web.Request, client: Client, table_id: str) -> bool:
    """Queue the client its snapshot and make it ready for events; True if the row was read
    from the database (commits delivered meanwhile may be missing: the caller catches up).
    A row this replica already has is current for every event it has delivered."""
    hub = request.app[HUB]
    row = hub.current(table_id)
    read = row is None
    identity = client.identity
    design = None
    if read or identity is not None:
        async with request.app[POOL].acquire() as conn:
            if row is None:
                row = await store.read_table(conn, table_id)
            design = await store.deck_design(conn, identity.id) if identity else None
        if read and row is not None:
            hub.remember(row)
        row = hub.current(table_id) or row  # a commit delivered while reading is newer
    assert row is not None
    seat = row.seat_of(identity.id if identity else None)
    # No await from here on: no event is queued between the snapshot and ``ready``.
    client.deck_design = design
    client.last_seq = max(client.last_seq, row.seq)
    hub.send(client, hub.snapshot_frame(row, seat, design))
    client.ready = True
    return read


async def _on_message(request: web.Request, client: Client, msg: WSMessage) -> None:
    """A text frame is a command; any other data frame is answered with an error."""
    if msg.type == WSMsgType.TEXT:
        await _on_text(request, client, msg.data)
    elif msg.type == WSMsgType.BINARY:
        message = "send each message as a text frame of JSON, not a binary frame"
        _send_error(request, client, ErrorDetail(code="invalid_request", message=message))


async def _on_text(request: web.Request, client: Client, text: str) -> None:
    try:
        if client.identity is None:
            _ws_command.decode(text)  # a malformed frame is told so first
            raise AuthError("connect with ?token=... to send commands")
        async with counted_command(request, client.identity):
            message = _ws_command.decode(text)
            raw = await run_command(request, message.command, client.identity)
        request.app[HUB].send(client, b'{"kind":"result","result":' + raw + b"}")
    except Exception as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            log.exception("ws_command_failed")
        else:
            _send_error(request, client, refusal[1])


def _send_error(request: web.Request, client: Client, detail: ErrorDetail) -> None:
    request.app[HUB].send(client, _json.encode(WsError(error=detail)))


def add_socket_route(app: web.Application) -> None:
    """The WebSocket route."""
    app.router.add_get("/v1/tables/{id}/ws", table_socket)
