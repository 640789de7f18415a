"""The chat service's v1 HTTP API (docs/DESIGN.md section 7): two routes, one error shape."""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from services.chat.chat import Behind, Chat
from shared.contracts.api import MAX_SEQ, ErrorDetail
from shared.contracts.commands import MAX_VERSION
from shared.contracts.envelope import Envelope
from shared.infra import web as web_edge
from shared.infra.auth import AuthError, Identity, Verifier, bearer
from shared.infra.service import POOL, SETTINGS
from shared.infra.web import Refused, whole_number

log = structlog.get_logger()

CHAT = web.AppKey("chat", Chat)
VERIFIER = web.AppKey("verifier", Verifier)
HISTORY_LIMIT = 50  # messages per page unless ``limit`` says otherwise
HISTORY_MAX = 100
# Read-your-writes: how long a message with ``after_version`` waits for the chat to catch up.
CATCH_UP_S = 2.0
CATCH_UP_FIRST_PAUSE_S = 0.005
CATCH_UP_MAX_PAUSE_S = 0.05
_json = msgspec.json.Encoder()


class PostMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/tables/{id}/messages``.

    ``after_version``: the table version the sender has seen (a view's ``version``); a sender
    just seated is then accepted once the chat has caught up with it (at most
    ``CATCH_UP_S``), or answered 503 with ``Retry-After``, never refused as a spectator.
    """

    text: str
    after_version: Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)] | None = None


_post_decoder = msgspec.json.Decoder(PostMessage)


class ChatMetrics:
    """Messages by outcome (``posted`` or the refusal's code)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.messages = Counter(
            "gin_chat_messages", "Chat messages by outcome", ["outcome"], registry=registry
        )


METRICS = web.AppKey("chat_metrics", ChatMetrics)


def _count_refusal(request: web.Request, status: int, detail: ErrorDetail) -> None:
    if request.method == "POST" and METRICS in request.app:
        request.app[METRICS].messages.labels(detail.code).inc()
    log.info("chat_refused", code=detail.code, status=status)


refusals = web_edge.refusals(on_refused=_count_refusal)


def identity_of(request: web.Request) -> Identity:
    """The caller's identity from the bearer token."""
    token = bearer(request.headers.get("Authorization"))
    if token is None:
        raise AuthError("this route needs 'Authorization: Bearer <token>'")
    return request.app[VERIFIER].verify(token)


async def post_message(request: web.Request) -> web.Response:
    """``POST /v1/tables/{id}/messages`` ``{"text": ...}``: a seated person writes.

    201 with the message's ``message_posted`` envelope (the same one the table's WebSocket
    delivers). 400 ``invalid_text``; 401 without a valid token; 403 ``spectators_cannot_chat``
    for anyone not seated (a bot's seat included); 404 ``no_such_table`` while the chat has not
    heard of the table; 409 ``table_closed`` once the table closed or expired; 429
    ``too_many_messages`` with ``Retry-After`` (whole seconds). With ``after_version`` (the
    table version the sender has seen), a sender the chat does not see seated yet is answered
    once the chat has caught up (at most ``CATCH_UP_S``), else 503 ``chat_catching_up`` with
    ``Retry-After``: never 403 or 404 to a person seated at that version.
    """
    identity = identity_of(request)
    body = _post_decoder.decode(await request.read())
    envelope = await _post_when_caught_up(request, identity, body)
    request.app[METRICS].messages.labels("posted").inc()
    log.info("message_posted", seq=envelope.seq, player=identity.id)  # never the text
    return web.Response(body=_json.encode(envelope), status=201, content_type="application/json")


async def _post_when_caught_up(
    request: web.Request, identity: Identity, body: PostMessage
) -> Envelope:
    """Post; while the chat is behind the sender's ``after_version``, wait (no connection
    held) and try again, for ``CATCH_UP_S`` at most, then 503."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + CATCH_UP_S
    pause = CATCH_UP_FIRST_PAUSE_S
    while True:
        try:
            async with request.app[POOL].acquire() as conn, conn.transaction():
                return await request.app[CHAT].post(
                    conn, request.match_info["id"], identity, body.text, body.after_version
                )
        except Behind:
            if loop.time() + pause > give_up_at:
                log.info("chat_behind", after_version=body.after_version)
                raise Refused(
                    503,
                    "chat_catching_up",
                    f"the chat has not caught up with table version {body.after_version} yet:"
                    " try again",
                    headers={"Retry-After": "1"},
                ) from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, CATCH_UP_MAX_PAUSE_S)


async def get_messages(request: web.Request) -> web.Response:
    """``GET /v1/tables/{id}/messages?after=N&limit=M``: the history, for anyone (no token).

    A JSON list of the ``message_posted`` envelopes numbered above ``after`` (default 0), in
    order, at most ``limit`` (default 50, at most 100): the same envelopes the WebSocket
    delivers, as ``GET /v1/tables/{id}/events`` lists the table's. The next page is
    ``after=<the last one's seq>``; an empty list means the caller has everything.
    """
    after = whole_number(request.query.get("after"), "after", 0, 0, MAX_SEQ)
    limit = whole_number(request.query.get("limit"), "limit", HISTORY_LIMIT, 1, MAX_SEQ)
    limit = min(limit, HISTORY_MAX)  # a larger page is asked for: the largest is sent
    async with request.app[POOL].acquire() as conn:
        page = await request.app[CHAT].history(conn, request.match_info["id"], after, limit)
    return web.Response(body=_json.encode(page), content_type="application/json")


def add_routes(app: web.Application) -> None:
    """The v1 routes and the token verifier."""
    app[VERIFIER] = Verifier.from_settings(app[SETTINGS])
    app.router.add_post("/v1/tables/{id}/messages", post_message)
    app.router.add_get("/v1/tables/{id}/messages", get_messages)
