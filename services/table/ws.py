"""The table WebSocket: a snapshot on connect, then every event with the viewer's new view.

Each replica has one exclusive queue, so it works with any number of replicas. A replica
delivers its own commits to its clients at once. Every table event reaches every replica's
queue from ``gin.sockets``, one message per relay batch; a replica sends on those of the
tables its clients watch that it has not sent yet (another replica committed them). Chat and
timer events come from ``gin.events``, bound for the tables its clients watch. Events come at
least once and in order per table; a client is sent each seq once, and a gap (a lost
message, a reconnect) is filled from the table's event log before the next event goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from aiohttp import WSCloseCode, WSMsgType, web
from aiormq.abc import DeliveredMessage
from prometheus_client import CollectorRegistry, Gauge

from services.table import store
from services.table.http import TABLES, identity_of, refusal_of, run_command
from services.table.store import Change, TableRow
from services.table.tables import Tables
from shared.contracts.api import WsCommand, WsError, WsEvent, WsSnapshot
from shared.contracts.envelope import Envelope, envelope_decoder
from shared.contracts.names import EVENTS_EXCHANGE, SOCKETS_EXCHANGE
from shared.contracts.views import TableView
from shared.infra.auth import AuthError, Identity
from shared.infra.service import POOL
from shared.infra.web import Refused

log = structlog.get_logger()
_json = msgspec.json.Encoder()
_ws_command = msgspec.json.Decoder(WsCommand)
GAP_FILL_LIMIT = 1000


class _Head(msgspec.Struct):
    """Where an event belongs: enough to skip one this replica has sent already."""

    table_id: str
    seq: int


_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_head_decoder = msgspec.json.Decoder(_Head)


@dataclass(eq=False)
class Client:
    """One open WebSocket at one table."""

    ws: web.WebSocketResponse
    identity: Identity | None
    deck_design: str | None = None
    ready: bool = False  # the snapshot went out: events may follow
    last_seq: int = 0
    last_chat_seq: int = 0
    notices: set[uuid.UUID] = field(default_factory=set)  # timer events sent (by envelope id)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Hub:
    """This replica's WebSocket clients, by table, fed from its own queue."""

    def __init__(
        self, pool: asyncpg.Pool, tables: Tables, prefix: str, registry: CollectorRegistry
    ) -> None:
        self.pool = pool
        self.tables = tables
        self.prefix = prefix
        self.clients: dict[str, set[Client]] = {}
        self.channel: AbstractChannel | None = None
        self.queue: AbstractQueue | None = None
        self.exchange: AbstractExchange | None = None
        self.batches = prefix + SOCKETS_EXCHANGE
        self.open_sockets = Gauge(
            "gin_websockets", "Open table WebSockets on this replica", registry=registry
        )

    async def start(self, connection: AbstractRobustConnection) -> None:
        """Open this replica's queue and start consuming."""
        self.channel = await connection.channel()
        await self.channel.set_qos(prefetch_count=256)
        self.exchange = await self.channel.get_exchange(self.prefix + EVENTS_EXCHANGE)
        self.queue = await self.channel.declare_queue(exclusive=True, auto_delete=True)
        await self.queue.bind(self.batches)
        await self._consume()
        connection.reconnect_callbacks.add(self._on_reconnect)

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

    async def attach(self, table_id: str, client: Client) -> None:
        """Watch a table: bind before the snapshot, so nothing after it is missed."""
        watchers = self.clients.setdefault(table_id, set())
        first = not watchers
        watchers.add(client)
        self.open_sockets.inc()
        if first and self.queue is not None and self.exchange is not None:
            for key in watched_keys(table_id):
                await self.queue.bind(self.exchange, key)

    async def detach(self, table_id: str, client: Client) -> None:
        """Stop watching; the last watcher of a table unbinds it."""
        watchers = self.clients.get(table_id, set())
        watchers.discard(client)
        self.open_sockets.dec()
        if not watchers:
            self.clients.pop(table_id, None)
            if self.queue is not None and self.exchange is not None:
                with contextlib.suppress(Exception):  # the broker may be away; no harm
                    for key in watched_keys(table_id):
                        await self.queue.unbind(self.exchange, key)

    async def close_all(self) -> None:
        """Close every socket with 1001 (going away): clients reconnect to another replica."""
        sockets = [client.ws for watchers in self.clients.values() for client in watchers]
        await asyncio.gather(
            *(
                ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")
                for ws in sockets
            ),
            return_exceptions=True,
        )

    async def _on_delivery(self, message: DeliveredMessage) -> None:
        try:
            if message.exchange == self.batches:
                await self.deliver_batch(message.body)
            else:
                await self.deliver(envelope_decoder.decode(message.body))
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
            await self.catch_up(table_id, [])

    async def deliver_batch(self, body: bytes) -> None:
        """A relay batch of table events (a JSON array of envelopes, of any tables): send on
        those this replica's clients were not sent yet, each table's in one catch-up."""
        behind: dict[str, list[Envelope]] = {}
        for raw in _batch_decoder.decode(body):
            head = _head_decoder.decode(raw)
            watchers = self.clients.get(head.table_id)
            if watchers and any(c.ready and c.last_seq < head.seq for c in watchers):
                behind.setdefault(head.table_id, []).append(envelope_decoder.decode(raw))
        for table_id, burst in behind.items():
            await self.catch_up(table_id, burst)

    async def deliver(self, envelope: Envelope) -> None:
        """An event from ``gin.events`` (chat, timers): send it to every client at its table
        not sent it yet."""
        watchers = {c for c in self.clients.get(envelope.table_id, ()) if c.ready}
        if not watchers:
            return
        if envelope.type == "message_posted":
            for client in list(watchers):
                if envelope.seq > client.last_chat_seq:
                    client.last_chat_seq = envelope.seq
                    await _send(client, WsEvent(event=envelope))
        elif envelope.type == "absence_claimable":  # from the timers: its own numbering
            for client in list(watchers):
                if envelope.id not in client.notices:
                    client.notices.add(envelope.id)
                    await _send(client, WsEvent(event=envelope))

    async def deliver_local(self, change: Change) -> None:
        """A change this replica just committed: its clients get it without the broker hop."""
        row = change.row
        if row.table_id in self.clients and change.envelopes:
            await self.catch_up(row.table_id, change.envelopes, row, dict(change.views))

    async def catch_up(
        self,
        table_id: str,
        burst: list[Envelope],
        row: TableRow | None = None,
        views: dict[tuple[int | None, str | None], TableView] | None = None,
    ) -> None:
        """Send each client its unsent events up to the newest of ``burst`` (or all), each
        with the viewer's view; the table's log fills any gap, in seq order."""
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
                if gap and row is not None:
                    raw = await store.events_after(conn, table_id, oldest, GAP_FILL_LIMIT)
                    missed = [envelope_decoder.decode(r) for r in raw]
        if row is None:
            return
        upto = row.seq if upto is None else upto
        events = {e.seq: e for e in missed if e.seq <= upto}
        events.update((e.seq, e) for e in burst)
        views = {} if views is None else views
        for client in list(watchers):
            seat = row.seat_of(client.identity.id if client.identity else None)
            key = (seat, client.deck_design)
            if key not in views:
                views[key] = self.tables.table_view(row, seat, client.deck_design)
            for seq in sorted(events):
                if seq > client.last_seq:
                    client.last_seq = seq
                    await _send(client, WsEvent(event=events[seq], view=views[key]))


async def _send(client: Client, message: msgspec.Struct) -> None:
    await _send_raw(client, _json.encode(message))


HUB = web.AppKey("hub", Hub)


def watched_keys(table_id: str) -> tuple[str, ...]:
    """The routing keys on ``gin.events`` of what a table's sockets receive besides its
    events (those come from ``gin.sockets``): chat and timers."""
    return (f"chat.{table_id}.*", f"timer.{table_id}.*")


async def table_socket(request: web.Request) -> web.StreamResponse:
    """``GET /v1/tables/{id}/ws``: watch a table; a seated client may also send commands."""
    table_id = request.match_info["id"]
    identity = identity_of(request, required=False)
    async with request.app[POOL].acquire() as conn:
        if await store.read_table(conn, table_id) is None:
            raise Refused(404, "no_such_table", "there is no such table")
    ws = web.WebSocketResponse(heartbeat=30.0)
    await ws.prepare(request)
    hub = request.app[HUB]
    client = Client(ws=ws, identity=identity)
    await hub.attach(table_id, client)
    try:
        await _snapshot(request, client, table_id)
        await hub.catch_up(table_id, [])  # anything committed after the snapshot was read
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await _on_text(request, client, msg.data)
            elif msg.type == WSMsgType.BINARY:
                await _on_text(request, client, msg.data.decode(errors="replace"))
    finally:
        await hub.detach(table_id, client)
    return ws


async def _snapshot(request: web.Request, client: Client, table_id: str) -> None:
    async with request.app[POOL].acquire() as conn:
        row: TableRow | None = await store.read_table(conn, table_id)
        identity = client.identity
        design = await store.deck_design(conn, identity.id) if identity else None
    assert row is not None
    seat = row.seat_of(identity.id if identity else None)
    async with client.lock:
        client.deck_design = design
        client.last_seq = max(client.last_seq, row.seq)
        view = request.app[TABLES].table_view(row, seat, design)
        await client.ws.send_frame(_json.encode(WsSnapshot(view=view)), WSMsgType.TEXT)
        client.ready = True


async def _on_text(request: web.Request, client: Client, text: str) -> None:
    try:
        message = _ws_command.decode(text)
        if client.identity is None:
            raise AuthError("connect with ?token=... to send commands")
        raw = await run_command(request, message.command, client.identity)
        await _send_raw(client, b'{"kind":"result","result":' + raw + b"}")
    except Exception as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            log.exception("ws_command_failed")
        else:
            await _send(client, WsError(error=refusal[1]))


async def _send_raw(client: Client, body: bytes) -> None:
    """One text frame of JSON already encoded (UTF-8), in order with the client's others."""
    if client.ws.closed:
        return
    async with client.lock:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await client.ws.send_frame(body, WSMsgType.TEXT)


def add_socket_route(app: web.Application) -> None:
    """The WebSocket route."""
    app.router.add_get("/v1/tables/{id}/ws", table_socket)
