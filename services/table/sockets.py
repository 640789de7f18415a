"""The table WebSocket's route, ``GET /v1/tables/{id}/ws``: open a socket, snapshot, read.

A socket is first refused if this replica is full (no file to spare, ``GIN_MAX_SOCKETS``
held, or its memory near its limit): it is opened only to be closed with 1013, since a
browser is told nothing of an upgrade refused over HTTP. Otherwise the hub (``hub.py``)
takes it, the client is queued its snapshot, and from then on every event with its view;
the frames the client sends are commands, run as over HTTP, each answered on the socket with
its result or error. A client that offers permessage-deflate is sent the frames the hub
compressed once for all (``deflate.py``).
"""

from __future__ import annotations

import msgspec
import structlog
from aiohttp import WSMessage, WSMsgType, web
from opentelemetry.trace import SpanKind

from services.table import archive, store
from services.table.clients import (
    ARCHIVED_REASON,
    CLOSE_ARCHIVED,
    CLOSE_TIMEOUT_S,
    CLOSE_TRY_AGAIN_LATER,
    TRY_AGAIN_REASON,
    WRITER_LIMIT_BYTES,
    Client,
    close_socket,
)
from services.table.decide import Rejected
from services.table.http import (
    TABLES,
    counted_command,
    identity_of,
    limit,
    refusal_of,
    run_command,
)
from services.table.hub import HUB
from services.table.lobby import LOBBY_KEY
from services.table.port import PgStore
from shared.contracts.api import ErrorDetail, WsCommand, WsError
from shared.infra import tracing
from shared.infra.auth import AuthError, Identity
from shared.infra.files import FileBudget
from shared.infra.internals import SharedDeflateResponse
from shared.infra.memory import MemoryBudget
from shared.infra.service import POOL, SETTINGS
from shared.infra.web import localized

log = structlog.get_logger()
_json = msgspec.json.Encoder()
_ws_command = msgspec.json.Decoder(WsCommand)

FILES = web.AppKey("files", FileBudget)
MEMORY = web.AppKey("memory", MemoryBudget)


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
    # A table this replica has seen full, or has the row of, exists (until it is archived:
    # its snapshot then finds no row, and the socket is closed with CLOSE_ARCHIVED).
    if table_id not in tables.seatings and hub.known.current(table_id) is None:
        async with request.app[POOL].acquire() as conn:
            try:
                await tables.seating(PgStore(conn), table_id)  # 404 if there is none
            except Rejected as exc:
                if exc.code == "no_such_table":
                    await archive.refuse_if_archived(conn, table_id)  # 410 if archived
                raise
    settings = request.app[SETTINGS]
    ws = await _prepared(request)
    client = await hub.open(table_id, ws, identity, request.transport)
    hub.expire_at(client, closes_at(identity, settings.auth_leeway_s))
    try:
        read = await _snapshot(request, client, table_id)
        if read is None:  # archived since this replica saw it
            tables.seatings.pop(table_id, None)
            await close_socket(client, CLOSE_ARCHIVED, ARCHIVED_REASON)
            return ws
        if read:
            await hub.catch_up(table_id, [])  # anything committed while the row was read
        async for msg in ws:
            await _on_message(request, client, msg)
    finally:
        await hub.release(client)
    return ws


def _full(request: web.Request) -> str | None:
    """Why this replica takes no more sockets ("files", "sockets", "memory"), or None if it
    does."""
    if not request.app[FILES].admits():
        return "files"
    if request.app[HUB].sockets >= request.app[SETTINGS].max_sockets:
        return "sockets"
    if not request.app[MEMORY].admits():
        return "memory"
    return None


async def _refuse_socket(request: web.Request, reason: str) -> web.WebSocketResponse:
    """Open the socket only to close it with 1013 and a reason: a browser's WebSocket is
    told nothing of an upgrade refused over HTTP (a 503 is a 1006 to the page, as a
    network cut is). The close is bounded as every close is."""
    ws = web.WebSocketResponse(timeout=CLOSE_TIMEOUT_S, compress=False)
    await ws.prepare(request)  # a plain GET, not an upgrade, is refused with 400 here
    request.app[HUB].metrics.refused.labels(reason).inc()
    await ws.close(code=CLOSE_TRY_AGAIN_LATER, message=TRY_AGAIN_REASON.encode())
    return ws


async def _snapshot(request: web.Request, client: Client, table_id: str) -> bool | None:
    """Queue the client its snapshot and make it ready for events; True if the row was read
    from the database (commits delivered meanwhile may be missing: the caller catches up);
    None if there is no row any more (the table was archived). A row this replica already
    has is current for every event it has delivered."""
    hub = request.app[HUB]
    row = hub.known.current(table_id)
    read = row is None
    identity = client.identity
    design = None
    if read or identity is not None:
        async with request.app[POOL].acquire() as conn:
            if row is None:
                row = await store.read_table(conn, table_id)
            design = await store.deck_design(conn, identity.id) if identity else None
        if read and row is not None:
            hub.known.remember(row)
        row = hub.known.current(table_id) or row  # a commit delivered while reading is newer
    if row is None:
        return None
    seat = row.seat_of(identity.id if identity else None)
    # No await from here on: no event is queued between the snapshot and ``ready``.
    client.deck_design = design
    client.last_seq = max(client.last_seq, row.seq)
    hub.send(client, hub.known.snapshot_frame(row, seat, design))
    client.ready = True
    return read


async def _on_message(request: web.Request, client: Client, msg: WSMessage) -> None:
    """A text frame is a command; any other data frame is answered with an error."""
    if msg.type == WSMsgType.TEXT:
        await _on_text(request, client, msg.data)
    elif msg.type == WSMsgType.BINARY:
        message = "send each message as a text frame of JSON, not a binary frame"
        _send_error(request, client, ErrorDetail(code="invalid_request", message=message))


WS_ROUTE = "/v1/tables/{id}/ws"


async def _on_text(request: web.Request, client: Client, text: str) -> None:
    try:
        if client.identity is None:
            _ws_command.decode(text)  # a malformed frame is told so first
            raise AuthError("connect with ?token=... to send commands")
        async with counted_command(request, client.identity):
            message = _ws_command.decode(text)
            with tracing.span("WS command", {"http.route": WS_ROUTE}, SpanKind.SERVER):
                raw = await run_command(request, message.command, client.identity)
        request.app[HUB].send(client, b'{"kind":"result","result":' + raw + b"}")
    except Exception as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            log.exception("ws_command_failed")
        else:
            _send_error(request, client, refusal[1])


def _send_error(request: web.Request, client: Client, detail: ErrorDetail) -> None:
    detail, _ = localized(request, detail)  # the language the upgrade request asked for
    request.app[HUB].send(client, _json.encode(WsError(error=detail)))


async def player_socket(request: web.Request) -> web.StreamResponse:
    """``GET /v1/players/me/ws``: the caller's tables as they change (``lobby.py``); admitted
    as a table socket is, with a token (a header, or ``?token=``) required."""
    full = _full(request)
    if full is not None:
        return await _refuse_socket(request, full)
    identity = identity_of(request, query_token=True)
    assert identity is not None
    await limit(request, "sockets", identity)
    settings = request.app[SETTINGS]
    hub, lobby = request.app[HUB], request.app[LOBBY_KEY]
    ws = await _prepared(request)
    client = await lobby.open(ws, identity, request.transport)
    hub.expire_at(client, closes_at(identity, settings.auth_leeway_s))
    try:
        await lobby.first_page(client, request.app[TABLES].now())
        async for msg in ws:  # it sends nothing: a frame from the client is answered so
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                message = "the player socket takes no messages: it only sends"
                _send_error(request, client, ErrorDetail(code="invalid_request", message=message))
    finally:
        await lobby.release(client)
    return ws


async def _prepared(request: web.Request) -> SharedDeflateResponse:
    """The socket's response, upgraded: frames the hub compressed once for all when the client
    offered permessage-deflate; past max_msg_size aiohttp closes it with 1009."""
    settings = request.app[SETTINGS]
    ws = SharedDeflateResponse(
        deflate=request.app[HUB].deflater.deflate,
        compress=settings.ws_deflate,
        heartbeat=30.0,
        max_msg_size=settings.ws_max_frame_bytes,
        writer_limit=WRITER_LIMIT_BYTES,
    )
    await ws.prepare(request)
    return ws


def add_socket_route(app: web.Application) -> None:
    """The WebSocket routes: a table's, and a player's tables'."""
    app.router.add_get(WS_ROUTE, table_socket)
    app.router.add_get("/v1/players/me/ws", player_socket)
