"""The v1 HTTP API of the table service (docs/DESIGN.md section 7): small handlers, one error
shape."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import structlog
from aiohttp import web

from services.table import archive, erasure, store
from services.table.commits import GroupCommit
from services.table.decide import Actor, Rejected
from services.table.handling import CommandMetrics, Commands, Committed
from services.table.listing import Lister, parse_status
from services.table.port import PgStore, TableStore
from services.table.store import Change
from services.table.tables import Tables
from shared.contracts.api import (
    LIST_LIMIT,
    MAX_HAND,
    MAX_LIST_LIMIT,
    MAX_SEQ,
    CommandResult,
    CreateTable,
    ErrorDetail,
    JoinTable,
    MintToken,
    Preferences,
    SeatBot,
    Token,
)
from shared.contracts.commands import command_decoder
from shared.engine import IllegalAction
from shared.infra import service
from shared.infra import web as web_edge
from shared.infra.auth import AuthError, Identity, Verifier, bearer, mint
from shared.infra.ops import REGISTRY
from shared.infra.ratelimit import RateLimited, RateLimiter
from shared.infra.service import POOL, SETTINGS
from shared.infra.web import Refusal, Refused, whole_number

log = structlog.get_logger()
T = TypeVar("T")

TABLES = web.AppKey("tables", Tables)
SitDown = Callable[[Tables, TableStore, str, Identity], Awaitable[tuple[CommandResult, Change]]]
COMMITTED: web.AppKey[Committed] = web.AppKey("committed")
GROUP_COMMIT = web.AppKey("group_commit", GroupCommit)
COMMANDS = web.AppKey("commands", Commands)
VERIFIER = web.AppKey("verifier", Verifier)
LIMITS = web.AppKey("rate_limits", RateLimiter)
LISTER = web.AppKey("lister", Lister)
_json = msgspec.json.Encoder()
# Refusals that mean the request itself was malformed rather than untimely.
BAD_INPUT = {"unknown_card", "invalid_meld", "overlapping_melds"}
EVENTS_LIMIT = 1000  # events per page of GET /v1/tables/{id}/events


METRICS = web.AppKey("command_metrics", CommandMetrics)


# The HTTP status of each refusal of the table's rules (``Rejected``); any other is a 409.
REJECTED_STATUS = {
    "no_such_table": 404,
    "not_seated": 403,
    "not_creator": 403,
    "not_a_bot_seat": 403,
    "bad_invite_code": 403,
    "not_timer": 403,
    "timer_expires_only": 403,
}


def refusal_of(exc: Exception) -> Refusal | None:
    """The table's refusals, the engine's (R-numbered), the shared ones, and unknown command
    types, each with its HTTP status."""
    if isinstance(exc, Rejected):
        status = REJECTED_STATUS.get(exc.code, 409)
        return status, ErrorDetail(code=exc.code, message=exc.message, rule=exc.rule), {}
    if isinstance(exc, IllegalAction):
        status = 400 if exc.code in BAD_INPUT else 409
        return status, ErrorDetail(code=exc.code, message=exc.message, rule=exc.rule), {}
    if isinstance(exc, msgspec.ValidationError):
        text = str(exc)
        if "`$.type`" in text or "`$.command.type`" in text:
            return 400, ErrorDetail(code="unknown_command", message=text), {}
    return web_edge.refusal_of(exc)


refusals = web_edge.refusals(refusal_of)


def identity_of(
    request: web.Request, required: bool = True, query_token: bool = False
) -> Identity | None:
    """The caller's identity from the bearer token, or from ``?token=`` where ``query_token``
    (the WebSocket route only: a browser cannot set headers on a WebSocket; a token in any
    other URL would end up in logs and histories)."""
    token = bearer(request.headers.get("Authorization"))
    if token is None and query_token:
        token = request.query.get("token")
    if token is None:
        if required:
            raise AuthError("this route needs 'Authorization: Bearer <token>'")
        return None
    return request.app[VERIFIER].verify(token)


async def body_of(request: web.Request, kind: type[T]) -> T:
    """The request body decoded as ``kind`` (an empty body is an empty object)."""
    raw = await request.read()
    return msgspec.json.decode(raw or b"{}", type=kind)


def json_bytes(body: bytes, status: int = 200) -> web.Response:
    """A response from JSON already encoded."""
    return web.Response(body=body, status=status, content_type="application/json")


async def create_table(request: web.Request) -> web.Response:
    """``POST /v1/tables``."""
    identity = identity_of(request)
    assert identity is not None
    body = await body_of(request, CreateTable)
    await limit(request, "tables", identity)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        created, change = await request.app[TABLES].create(
            PgStore(conn), identity, body.options.plain()
        )
    request.app[COMMITTED](change)
    structlog.contextvars.bind_contextvars(table_id=created.table_id)
    log.info("table_created")
    return json_bytes(_json.encode(created), status=201)


async def join_table(request: web.Request) -> web.Response:
    """``POST /v1/tables/{id}/join``."""
    identity = identity_of(request)
    assert identity is not None
    body = await body_of(request, JoinTable)
    await limit(request, "joins", identity)
    return await _take_seat(
        request,
        identity,
        lambda tables, conn, table, who: tables.join(conn, table, who, body.invite_code),
    )


async def seat_bot(request: web.Request) -> web.Response:
    """``POST /v1/tables/{id}/bot``."""
    identity = identity_of(request)
    assert identity is not None
    body = await body_of(request, SeatBot)
    await limit(request, "joins", identity)  # a seating, as a join is: it locks the row
    return await _take_seat(
        request,
        identity,
        lambda tables, conn, table, who: tables.seat_bot(conn, table, who, body.level),
    )


async def _take_seat(request: web.Request, identity: Identity | None, sit: SitDown) -> web.Response:
    """Fill the free seat in one transaction, then deliver the change to this replica."""
    assert identity is not None
    async with request.app[POOL].acquire() as conn, conn.transaction():
        result, change = await sit(
            request.app[TABLES], PgStore(conn), request.match_info["id"], identity
        )
    request.app[COMMITTED](change)
    return json_bytes(_json.encode(result))


async def get_table(request: web.Request) -> web.Response:
    """``GET /v1/tables/{id}``: a seat view for a seated caller, the public view otherwise."""
    identity = identity_of(request, required=False)
    async with request.app[POOL].acquire() as conn:
        row = await store.read_table(conn, request.match_info["id"])
        if row is None:
            await archive.refuse_if_archived(conn, request.match_info["id"])
            raise Refused(404, "no_such_table", "there is no such table")
        design = await store.deck_design(conn, identity.id) if identity else None
    seat = row.seat_of(identity.id if identity else None)
    return json_bytes(_json.encode(request.app[TABLES].table_view(row, seat, design)))


async def run_command(request: web.Request, command: Any, identity: Identity) -> bytes:
    """Apply one person's command at the route's table (its sender's limits are the
    caller's: ``counted_command``): its answer as JSON."""
    actor = Actor(kind="person", identity=identity)
    table_id = request.match_info["id"]
    try:
        handled = await request.app[COMMANDS].handle(actor, table_id, command)
    except Rejected as exc:
        if exc.code == "no_such_table":  # an archived one answers where it went (410)
            async with request.app[POOL].acquire() as conn:
                await archive.refuse_if_archived(conn, table_id)
        raise
    return handled.result


async def post_command(request: web.Request) -> web.Response:
    """``POST /v1/tables/{id}/commands``."""
    identity = identity_of(request)
    assert identity is not None
    async with counted_command(request, identity):
        command = command_decoder.decode(await request.read())
        return json_bytes(await run_command(request, command, identity))


@contextlib.asynccontextmanager
async def counted_command(request: web.Request, identity: Identity) -> AsyncIterator[None]:
    """A person's command, counted against the ``commands`` limit before anything is read;
    one refused for what it is (a 4xx: a spectator's, a stale one, malformed) also counts
    against ``refusals``, past which its answer is 429 (held back) instead: a client whose
    commands are all refused is slowed after a few dozen, not after the commands limit."""
    await limit(request, "commands", identity)
    try:
        yield
    except Exception as exc:
        refusal = refusal_of(exc)
        if refusal is not None and refusal[0] < 500 and not isinstance(exc, RateLimited):
            await limit(request, "refusals", identity)
        raise


async def get_events(request: web.Request) -> web.Response:
    """``GET /v1/tables/{id}/events?after=N``: public events to catch up after a reconnect."""
    after = whole_number(request.query.get("after"), "after", 0, 0, MAX_SEQ)
    limit = whole_number(request.query.get("limit"), "limit", EVENTS_LIMIT, 1, MAX_SEQ)
    limit = min(limit, EVENTS_LIMIT)  # a larger page is asked for: the largest is sent
    table_id = request.match_info["id"]
    async with request.app[POOL].acquire() as conn:
        if await store.read_table(conn, table_id) is None:
            await archive.refuse_if_archived(conn, table_id)
            raise Refused(404, "no_such_table", "there is no such table")
        rows = await store.events_after(conn, table_id, after, limit)
    return json_bytes(b"[" + ",".join(rows).encode() + b"]")


async def get_hand(request: web.Request) -> web.Response:
    """``GET /v1/tables/{id}/hands/{n}``: a finished hand's full record, deck and salt."""
    number = whole_number(request.match_info["n"], "the hand number", 1, 1, MAX_HAND)
    async with request.app[POOL].acquire() as conn:
        record = await store.hand_record(conn, request.match_info["id"], number)
        if record is None:
            await archive.refuse_if_archived(conn, request.match_info["id"])
    if record is None:
        raise Refused(404, "no_such_hand", "no such hand has ended at this table", "R11.3")
    return json_bytes(record.encode())


async def get_preferences(request: web.Request) -> web.Response:
    """``GET /v1/players/me/preferences`` (R10.7)."""
    identity = identity_of(request)
    assert identity is not None
    async with request.app[POOL].acquire() as conn:
        design = await store.deck_design(conn, identity.id)
    return web.json_response({"deck_design": design})


async def get_my_tables(request: web.Request) -> web.Response:
    """``GET /v1/players/me/tables?status=&limit=&after=``: a page of the caller's tables,
    theirs to play first (``listing.py``). Counted against ``lists``: a read, but one that
    reads every table of its caller to order them."""
    identity = identity_of(request)
    assert identity is not None
    status = parse_status(request.query.get("status"))
    size = whole_number(request.query.get("limit"), "limit", LIST_LIMIT, 1, MAX_LIST_LIMIT)
    after = request.query.get("after")
    await limit(request, "lists", identity)
    lister, now = request.app[LISTER], request.app[TABLES].now()
    async with request.app[POOL].acquire() as conn:
        page = await lister.page(conn, identity.id, status, size, after, now)
    return json_bytes(_json.encode(page))


async def put_preferences(request: web.Request) -> web.Response:
    """``PUT /v1/players/me/preferences`` (R10.7)."""
    identity = identity_of(request)
    assert identity is not None
    body = await body_of(request, Preferences)
    await limit(request, "preferences", identity)
    async with request.app[POOL].acquire() as conn:
        await store.set_deck_design(conn, identity.id, body.deck_design)
    return web.json_response({"deck_design": body.deck_design})


async def erase_player(request: web.Request) -> web.Response:
    """``DELETE /v1/players/me``: erase the caller's personal data (LGPD art. 18,
    ``erasure.py``); 204, and 204 again for nothing left to erase. Counted against
    ``preferences``: like them, a write of the caller's own data only."""
    identity = identity_of(request)
    assert identity is not None
    await limit(request, "preferences", identity)
    tables = request.app[TABLES]
    erased = await erasure.erase_everywhere(
        request.app[POOL], tables, identity, request.app[SETTINGS].archive_url
    )
    erasure.forget(tables, identity.id, erased)
    for change in erased.changes:
        request.app[COMMITTED](change)
    log.info("player_erased", tables=len(erased.changes))  # never the subject: it is erased
    return web.Response(status=204)


async def mint_token(request: web.Request) -> web.Response:
    """``POST /v1/dev/tokens``: development only."""
    body = await body_of(request, MintToken)
    sub = body.sub or f"dev-{uuid.uuid4().hex[:12]}"
    token = mint(request.app[SETTINGS].auth_secret, sub, body.name)
    return json_bytes(_json.encode(Token(token=token, sub=sub, name=body.name)), status=201)


async def _rate_limits(app: web.Application) -> AsyncIterator[None]:
    """Per-identity limits shared with the other replicas through the database."""
    app[LIMITS] = RateLimiter.from_settings(app[POOL], app[SETTINGS], registry=app[REGISTRY])
    sharing = asyncio.create_task(app[LIMITS].run(), name="rate-limit-sync")
    yield
    await service.cancel(sharing)


async def limit(request: web.Request, action: str, identity: Identity) -> None:
    """Count one ``action`` of this identity, or refuse it (429 with Retry-After, held back
    first: ``RateLimiter.admit``)."""
    if LIMITS in request.app:
        await request.app[LIMITS].admit(action, identity.id, lambda: request.transport is None)


async def _release_holds(app: web.Application) -> None:
    """At shutdown, answer the held refusals at once: they must not hold the drain."""
    if LIMITS in app:
        app[LIMITS].holds.release()


# Each route that writes or takes a lock, and the per-identity limit it counts against
# (``limit``; docs/DESIGN.md section 7 has the table). None: it writes nothing.
# tests/table/test_limits.py walks docs/openapi.yaml against this table.
WRITE_LIMITS: dict[tuple[str, str], str | None] = {
    ("POST", "/v1/tables"): "tables",
    ("POST", "/v1/tables/{id}/join"): "joins",
    ("POST", "/v1/tables/{id}/bot"): "joins",
    ("POST", "/v1/tables/{id}/commands"): "commands",  # rematch, resign, leave: commands too
    ("PUT", "/v1/players/me/preferences"): "preferences",
    ("DELETE", "/v1/players/me"): "preferences",  # the erasure: the caller's own data too
    ("POST", "/v1/dev/tokens"): None,  # development only: signs a token, writes nothing
}
# The reads that are limited: the others read one table, or a page of one table's log, by
# key; these read every table of their caller (to order them) or hold a socket.
READ_LIMITS: dict[tuple[str, str], str] = {
    ("GET", "/v1/players/me/tables"): "lists",
    ("GET", "/v1/tables/{id}/ws"): "sockets",  # a seated or named watcher's
    ("GET", "/v1/players/me/ws"): "sockets",
}


def add_routes(app: web.Application, dev_tokens: bool) -> None:
    """The v1 routes (the WebSocket route is added by ``ws.py``), the token verifier and the
    rate limits (once the pool is open)."""
    settings = app[SETTINGS]
    app[VERIFIER] = Verifier.from_settings(settings)
    app[LISTER] = Lister(settings.absence_after_s, settings.expiry_after_s, settings.auth_secret)
    app.cleanup_ctx.append(_rate_limits)
    app.on_shutdown.append(_release_holds)
    r = app.router
    r.add_post("/v1/tables", create_table)
    r.add_post("/v1/tables/{id}/join", join_table)
    r.add_post("/v1/tables/{id}/bot", seat_bot)
    r.add_get("/v1/tables/{id}", get_table)
    r.add_post("/v1/tables/{id}/commands", post_command)
    r.add_get("/v1/tables/{id}/events", get_events)
    r.add_get("/v1/tables/{id}/hands/{n}", get_hand)
    r.add_get("/v1/players/me/tables", get_my_tables)
    r.add_get("/v1/players/me/preferences", get_preferences)
    r.add_put("/v1/players/me/preferences", put_preferences)
    r.add_delete("/v1/players/me", erase_player)
    if dev_tokens:
        r.add_post("/v1/dev/tokens", mint_token)
