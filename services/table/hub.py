"""The hub: this replica's table sockets by table, and what each is sent, once and in order.

A replica delivers its own commits to its clients without the broker hop: the command hands
the change to the hub's inbox and answers at once; the hub's task delivers it after the
response. Other replicas' commits come through the feed (``feed.py``) in relay batches; the
hub sends on those of the tables its clients watch that it has not sent yet. Events come at
least once and in order per table; a client is sent each seq once, and a gap (a lost
message, a reconnect) is filled from the table's event log before the next event goes out.

A catch-up that fails (the database away) and a binding the broker refused are retried by
one task with a bounded backoff until they succeed (``behind``, ``unbound``). The sockets'
queues, writers and closes are in ``clients.py``; the route that opens them in
``sockets.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import asyncpg
import msgspec
import structlog
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from aiohttp import web
from prometheus_client import CollectorRegistry

from services.table import store
from services.table.clients import (
    CLOSE_GOING_AWAY,
    CLOSE_TOKEN_EXPIRED,
    CLOSE_TOO_SLOW,
    GOING_AWAY_REASON,
    TOKEN_EXPIRED_REASON,
    TOO_SLOW_REASON,
    Client,
    SocketMetrics,
    abort_if_stuck,
    close_socket,
    discard_frames,
    queue_frame,
    write_frames,
)
from services.table.deflate import Deflater
from services.table.feed import Feed, batch_heads
from services.table.frames import ViewKey, event_frames
from services.table.known import Known
from services.table.store import Change, TableRow
from services.table.tables import Tables
from shared.contracts.api import WsEvent
from shared.contracts.envelope import Envelope, envelope_decoder
from shared.contracts.views import TableView
from shared.infra.auth import Identity

log = structlog.get_logger()
_json = msgspec.json.Encoder()
GAP_FILL_LIMIT = 1000
# A table whose catch-up failed (the database away) is caught up again after this long,
# doubling up to the most, until one succeeds.
RETRY_FIRST_S = 0.2
RETRY_MOST_S = 5.0


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
        self.send_queue = send_queue
        self.clients: dict[str, set[Client]] = {}
        self.sockets = 0  # the clients of every table: what GIN_MAX_SOCKETS bounds
        self.feed = Feed(prefix, self)
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
        # Of each watched table: its newest row and seq here, for new sockets' snapshots.
        self.known = Known(tables, self.clients)
        # Frames compressed once for every socket that negotiated permessage-deflate.
        self.deflater = Deflater()
        # Watched tables whose catch-up failed: the batch that told of their events is gone
        # (the queue is consumed without acks), so they are caught up from the log again.
        self.behind: set[str] = set()
        # Watched tables whose chat and timer keys are not bound: the broker's channel was
        # away when their first watcher came. Bound by the same task, and the socket served.
        self.unbound: set[str] = set()
        # Watched tables with clients to send a snapshot again (``Client.missed``).
        self.missed: set[str] = set()
        self.retrying: asyncio.Task[None] | None = None
        # Told of every table event this replica hears (the player sockets, ``lobby.py``),
        # and the sockets it holds besides the tables' (closed with them at shutdown).
        self.heard: Callable[[str, str, msgspec.Raw], None] | None = None
        # Told when the feed's channel reopened: nothing was heard while it was away.
        self.reopened: Callable[[], None] | None = None
        self.others: Callable[[], list[Client]] = list

    @property
    def channel(self) -> AbstractChannel | None:
        """The feed's channel on the broker (None before ``start``)."""
        return self.feed.channel

    async def start(self, connection: AbstractRobustConnection) -> None:
        """Open this replica's queue and consume; start delivering this replica's commits."""
        await self.feed.start(connection)
        self.task = asyncio.get_running_loop().create_task(self._deliver_commits(), name="ws-hub")

    async def stop(self) -> None:
        """Stop the delivery tasks and wait for the closes under way (each is bounded)."""
        for task in (self.task, self.retrying):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.gather(*self.closing, return_exceptions=True)

    # --- clients ------------------------------------------------------------------------------

    async def open(
        self,
        table_id: str,
        ws: web.WebSocketResponse,
        identity: Identity | None,
        transport: asyncio.Transport | None = None,
    ) -> Client:
        """A client for a prepared socket, with its queue and writer, watching its table."""
        client = self.new_client(table_id, ws, identity, transport)
        await self.attach(table_id, client)
        return client

    def new_client(
        self,
        table_id: str,
        ws: web.WebSocketResponse,
        identity: Identity | None,
        transport: asyncio.Transport | None,
    ) -> Client:
        """A client for a prepared socket, with its queue and writer, watching nothing yet
        (the player sockets' too, ``lobby.py``)."""
        client = Client(
            ws=ws,
            identity=identity,
            table_id=table_id,
            frames=asyncio.Queue(maxsize=self.send_queue),
            transport=transport,
        )
        client.writer = asyncio.get_running_loop().create_task(write_frames(client, self.metrics))
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
            await self.feed.bind(table_id)
        except Exception as exc:  # the broker's channel is away: bind when it is back
            log.warning("ws_bind_failed", table_id=table_id, error=repr(exc))
            self.unbound.add(table_id)
            self._retry()

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
        self.missed.discard(client.table_id)
        self.known.forget(client.table_id)
        return True

    async def _unbind(self, table_id: str) -> None:
        """Stop hearing a table nobody here watches now (unless someone came back)."""
        await self.feed.unbind(table_id, self.clients.__contains__)

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
        discard_frames(client, self.metrics)
        return self._remove(client)

    async def release(self, client: Client) -> None:
        """The socket's handler is done: the client is forgotten, its transport freed."""
        if self._forget(client):
            await self._unbind(client.table_id)
        if client.closing is None and client.ws.closed:
            abort_if_stuck(client.transport)

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
        for client in self.others():
            self.drop(client, CLOSE_GOING_AWAY, GOING_AWAY_REASON)
        await asyncio.gather(*self.closing, return_exceptions=True)

    def send(self, client: Client, frame: bytes) -> None:
        """Queue one text frame of JSON (UTF-8) for a client, in order; never waits. A
        client whose queue is full is closed as too slow."""
        if client.gone:
            return
        if not queue_frame(client, frame, self.metrics):
            self.metrics.too_slow.inc()
            log.info("ws_client_too_slow", table_id=client.table_id, last_seq=client.last_seq)
            self.drop(client, CLOSE_TOO_SLOW, TOO_SLOW_REASON)

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

    async def resync(self) -> None:
        """After the feed's channel reopened (a reconnect, or the channel alone): consume
        again, then send every client what it may have missed: the table's events, and a
        snapshot again for what only the client can read back (the chat and the timers'
        notices posted while the queue was gone: the hub keeps no log of them)."""
        try:
            await self.feed.consume()
        except Exception as exc:  # the channel closed again: its next reopen retries
            log.warning("ws_consume_failed", error=repr(exc))
            return
        if self.reopened is not None:
            self.reopened()
        for table_id in list(self.clients):
            if table_id not in self.unbound:  # an unbound one is told so once bound
                self._missed(table_id)
            await self.catch_up_or_retry(table_id, [])

    def _missed(self, table_id: str) -> None:
        """The feed may have missed the table's chat and notices: each of its clients sent
        its snapshot already is sent one again after the table's next whole catch-up (one
        whose snapshot is still to come reads its chat after that one)."""
        ready = self._ready(table_id)
        for client in ready:
            client.missed = True
        if ready:
            self.missed.add(table_id)

    async def deliver_batch(self, body: bytes) -> None:
        """A relay batch of table events (a JSON array of envelopes, of any tables): send on
        those this replica's clients were not sent yet, each table's in one catch-up."""
        behind: dict[str, list[Envelope]] = {}
        for head, raw in batch_heads(body):
            if self.heard is not None:
                self.heard(head.table_id, head.type, raw)
            if head.seq <= self.coming.get(head.table_id, 0):
                continue  # this replica's own commit, on its way from the inbox
            self._forget_stale(head.table_id, head.seq, head.type)
            self.known.hear(head.table_id, head.seq)
            watchers = self.clients.get(head.table_id)
            if watchers and any(c.ready and c.last_seq < head.seq for c in watchers):
                behind.setdefault(head.table_id, []).append(envelope_decoder.decode(raw))
        for table_id, burst in behind.items():
            await self.catch_up_or_retry(table_id, burst)

    def _forget_stale(self, table_id: str, seq: int, event_type: str) -> None:
        """Another replica committed at the table: the row this one remembers is stale (a
        command on it would only fail its version check), and after an erasure its seating
        names a person who is gone; neither is kept, so neither lingers in memory."""
        memory = self.tables.memory
        row = memory.row(table_id)
        if row is not None and row.seq < seq:
            memory.forget_row(table_id)
        if event_type == "player_erased":
            memory.seatings.pop(table_id, None)

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
            bound = await self._bind_unbound()
            caught_up = await self._catch_up_behind()
            wait = RETRY_FIRST_S if bound and caught_up else min(wait * 2, RETRY_MOST_S)

    async def _bind_unbound(self) -> bool:
        """Bind each table of ``unbound`` (unbinding it again if nobody watches it now);
        False if any bind failed (it stays in ``unbound``)."""
        done = True
        for table_id in list(self.unbound):
            try:
                await self.feed.bind(table_id)
            except Exception as exc:
                log.warning("ws_bind_failed", table_id=table_id, error=repr(exc))
                done = False
                continue
            self.unbound.discard(table_id)
            if table_id not in self.clients:  # its last watcher left meanwhile
                await self._unbind(table_id)
            else:  # its watchers heard none of the chat posted before: they read it back
                self._missed(table_id)
                self.behind.add(table_id)
        return done

    async def _catch_up_behind(self) -> bool:
        """Catch up each table of ``behind`` from its log; False if any failed (it stays in
        ``behind``)."""
        done = True
        for table_id in list(self.behind):
            self.behind.discard(table_id)  # a table unwatched meanwhile: nothing to do
            try:
                await self.catch_up(table_id, [])
            except Exception as exc:
                log.warning("ws_catch_up_failed", table_id=table_id, error=repr(exc))
                self.behind.add(table_id)
                done = False
        return done

    async def deliver(self, envelope: Envelope) -> None:
        """An event from ``gin.events`` (chat, timers): send it to every client at its table
        not sent it yet (one frame, shared)."""
        watchers = self._ready(envelope.table_id)
        if not watchers:
            return
        frame = _json.encode(WsEvent(event=envelope))
        if envelope.type == "message_posted":
            for client in watchers:
                if envelope.seq > client.last_chat_seq:
                    client.last_chat_seq = envelope.seq
                    self.send(client, frame)
        # The timer stream (absence_claimable, turn_reminder), numbered on its own: each once.
        # An absence_claimable from before the envelope had a stream says "table".
        elif envelope.stream == "timer" or envelope.type == "absence_claimable":
            for client in watchers:
                if envelope.id not in client.notices:
                    client.notices.add(envelope.id)
                    self.send(client, frame)

    async def deliver_local(self, change: Change) -> None:
        """A change this replica committed: its clients get it without the broker hop."""
        row = change.row
        self.known.remember(row)
        if row.table_id in self.clients and change.envelopes:
            await self.catch_up(row.table_id, change.envelopes, row, dict(change.views))

    def _ready(self, table_id: str) -> list[Client]:
        """The clients at a table whose snapshot is queued: those events may be sent."""
        return [c for c in self.clients.get(table_id, ()) if c.ready]

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
        watchers = self._ready(table_id)
        if not watchers:
            return
        oldest = min(c.last_seq for c in watchers)
        have = {e.seq for e in burst}
        gap = has_gap(oldest, have)
        missed: list[Envelope] = []
        if gap or row is None:
            row, missed = await self._read(table_id, row, oldest if gap else None)
        if row is None:
            return
        upto = max(have) if have else row.seq
        events = {e.seq: e for e in missed if e.seq <= upto}
        events.update((e.seq, e) for e in burst)
        self._send_events(table_id, row, events, {} if views is None else views)
        self._send_snapshots(table_id, row)

    async def _read(
        self, table_id: str, row: TableRow | None, after: int | None
    ) -> tuple[TableRow | None, list[Envelope]]:
        """What a catch-up lacks, on one connection: the table's row unless given (kept as
        the newest known), and if ``after`` is given its logged events past that seq (up to
        ``GAP_FILL_LIMIT``); no events without a row."""
        missed: list[Envelope] = []
        async with self.pool.acquire() as conn:
            if row is None:
                row = await store.read_table(conn, table_id)
                if row is not None:
                    self.known.remember(row)
            if after is not None and row is not None:
                raw = await store.events_after(conn, table_id, after, GAP_FILL_LIMIT)
                missed = [envelope_decoder.decode(r) for r in raw]
        return row, missed

    def _send_events(
        self,
        table_id: str,
        row: TableRow,
        events: dict[int, Envelope],
        views: dict[ViewKey, TableView],
    ) -> None:
        """Queue each ready client the events past its ``last_seq`` (``frames.py``)."""
        view_of = self.tables.table_view
        for client, seq, frame in event_frames(self._ready(table_id), row, events, views, view_of):
            client.last_seq = seq
            self.send(client, frame)

    def _send_snapshots(self, table_id: str, row: TableRow) -> None:
        """Queue a snapshot again to each client that may have missed the table's chat or
        notices, once it has every event of ``row`` (its snapshot is then no news to it but
        what it reads back, as after a reconnect: DESIGN §7)."""
        if table_id not in self.missed:  # the common case: one set lookup a catch-up
            return
        left = False
        for client in self._ready(table_id):
            if client.missed and client.last_seq == row.seq:
                client.missed = False
                seat = row.seat_of(client.identity.id if client.identity else None)
                self.send(client, self.known.snapshot_frame(row, seat, client.deck_design))
            left = left or client.missed
        if not left:
            self.missed.discard(table_id)


def has_gap(after: int, have: set[int]) -> bool:
    """Whether the seqs ``have`` leave one out between ``after`` and their newest (or are
    none at all: then everything past ``after`` is to be read)."""
    return not have or any(seq not in have for seq in range(after + 1, max(have) + 1))


HUB = web.AppKey("hub", Hub)
