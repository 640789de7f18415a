"""The chat service's v1 HTTP API (DESIGN.md section 7): two routes, one error shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from services.chat.chat import Chat, Refused
from shared.contracts.api import ErrorBody, ErrorDetail
from shared.infra.auth import AuthError, Identity, bearer, verify
from shared.infra.service import POOL, SETTINGS

log = structlog.get_logger()

CHAT = web.AppKey("chat", Chat)
HISTORY_LIMIT = 50  # messages per page unless ``limit`` says otherwise
HISTORY_MAX = 100
_json = msgspec.json.Encoder()


class PostMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/tables/{id}/messages``."""

    text: str


_post_decoder = msgspec.json.Decoder(PostMessage)


class ChatMetrics:
    """Messages by outcome (``posted`` or the refusal's code)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = Counter(
            "gin_chat_messages", "Chat messages by outcome", ["outcome"], registry=registry
        )


METRICS = web.AppKey("chat_metrics", ChatMetrics)


def error_response(
    status: int, detail: ErrorDetail, headers: dict[str, str] | None = None
) -> web.Response:
    """The one error shape: ``{"error": {"code", "message", "rule"}}``."""
    return web.json_response(
        body=_json.encode(ErrorBody(error=detail)), status=status, headers=headers
    )


def refusal_of(exc: Exception) -> tuple[int, ErrorDetail, dict[str, str]]:
    """The HTTP status, error body and headers of a refused request."""
    if isinstance(exc, Refused):
        return (
            exc.status,
            ErrorDetail(code=exc.code, message=exc.message, rule=exc.rule),
            exc.headers,
        )
    if isinstance(exc, AuthError):
        return 401, ErrorDetail(code="unauthorized", message=str(exc)), {}
    if isinstance(exc, msgspec.ValidationError):
        return 400, ErrorDetail(code="invalid_request", message=str(exc)), {}
    if isinstance(exc, msgspec.DecodeError):
        return 400, ErrorDetail(code="malformed_json", message=f"the body is not JSON: {exc}"), {}
    raise exc


@web.middleware
async def log_context(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Each request logs with its own context: the table it names."""
    structlog.contextvars.clear_contextvars()
    if "id" in request.match_info:
        structlog.contextvars.bind_contextvars(table_id=request.match_info["id"])
    return await handler(request)


@web.middleware
async def refusals(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn every refusal into the error shape; nothing was changed by a refused request."""
    try:
        return await handler(request)
    except (Refused, AuthError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        status, detail, headers = refusal_of(exc)
        if request.method == "POST" and METRICS in request.app:
            request.app[METRICS].messages.labels(detail.code).inc()
        log.info("chat_refused", code=detail.code, status=status)
        return error_response(status, detail, headers)


def identity_of(request: web.Request) -> Identity:
    """The caller's identity from the bearer token."""
    token = bearer(request.headers.get("Authorization"))
    if token is None:
        raise AuthError("this route needs 'Authorization: Bearer <token>'")
    return verify(request.app[SETTINGS].auth_secret, token)


async def post_message(request: web.Request) -> web.Response:
    """``POST /v1/tables/{id}/messages`` ``{"text": ...}``: a seated person writes.

    201 with the message's ``message_posted`` envelope (the same one the table's WebSocket
    delivers). 400 ``invalid_text``; 401 without a valid token; 403 ``spectators_cannot_chat``
    for anyone not seated (a bot's seat included); 404 ``no_such_table`` while the chat has not
    heard of the table; 409 ``table_closed`` once the table closed or expired; 429
    ``too_many_messages`` with ``Retry-After`` (whole seconds).
    """
    identity = identity_of(request)
    body = _post_decoder.decode(await request.read())
    async with request.app[POOL].acquire() as conn, conn.transaction():
        envelope = await request.app[CHAT].post(conn, request.match_info["id"], identity, body.text)
    request.app[METRICS].messages.labels("posted").inc()
    log.info("message_posted", seq=envelope.seq, player=identity.id)  # never the text
    return web.Response(body=_json.encode(envelope), status=201, content_type="application/json")


async def get_messages(request: web.Request) -> web.Response:
    """``GET /v1/tables/{id}/messages?after=N&limit=M``: the history, for anyone (no token).

    A JSON list of the ``message_posted`` envelopes numbered above ``after`` (default 0), in
    order, at most ``limit`` (default 50, at most 100): the same envelopes the WebSocket
    delivers, as ``GET /v1/tables/{id}/events`` lists the table's. The next page is
    ``after=<the last one's seq>``; an empty list means the caller has everything.
    """
    try:
        after = int(request.query.get("after", "0"))
        limit = min(int(request.query.get("limit", str(HISTORY_LIMIT))), HISTORY_MAX)
    except ValueError as exc:
        raise Refused(400, "invalid_request", "after and limit are whole numbers") from exc
    if after < 0 or limit < 1:
        raise Refused(400, "invalid_request", "after >= 0 and limit >= 1")
    async with request.app[POOL].acquire() as conn:
        page = await request.app[CHAT].history(conn, request.match_info["id"], after, limit)
    return web.Response(body=_json.encode(page), content_type="application/json")


def add_routes(app: web.Application) -> None:
    """The v1 routes."""
    app.router.add_post("/v1/tables/{id}/messages", post_message)
    app.router.add_get("/v1/tables/{id}/messages", get_messages)
