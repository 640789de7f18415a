"""The HTTP edge every service shares: the one error shape, refusals, per-request log context.

A refused request answers ``{"error": {"code", "message", "rule"}}`` with a 4xx and changes
nothing. Each service adds its own refusals (the engine's, say) through ``classify``. A refusal
is raised with its English message; the answer's message is in the language the request's
``Accept-Language`` asks for (``shared/contracts/messages.py``), named by ``Content-Language``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping

import asyncpg
import msgspec
import structlog
from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from shared.contracts.api import TABLE_ID_PATTERN, ErrorBody, ErrorDetail
from shared.contracts.messages import language_of, translated
from shared.infra import db
from shared.infra.auth import AuthError
from shared.infra.ratelimit import RateLimited

log = structlog.get_logger()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refusal = tuple[int, ErrorDetail, Mapping[str, str]]
_json = msgspec.json.Encoder()
AIOHTTP_CODES = {404: "no_such_route", 405: "method_not_allowed", 413: "body_too_large"}
# How long a request's body may take to arrive whole (``GIN_BODY_READ_S``), set by each app:
# a client that sends its headers and then the body never, or a byte a minute, would hold the
# connection and its handler for as long as it liked.
BODY_READ_S = web.AppKey("body_read_s", float)
DEFAULT_BODY_READ_S = 10.0
# How long a request's head (request line and headers) may take to arrive whole
# (``GIN_HEAD_READ_S``), read by ``serving.Runner``: 408 past it, as for a body.
HEAD_READ_S = web.AppKey("head_read_s", float)
DEFAULT_HEAD_READ_S = 10.0


class BodyTooSlow(Exception):
    """A request's body did not arrive whole within the app's ``BODY_READ_S``."""


TABLE_ID = re.compile(TABLE_ID_PATTERN)  # routes and the archive's restore command check ids


class Refused(Exception):
    """A request refused before any change: an HTTP status, the error body's fields and any
    headers the answer needs (``Retry-After``)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        rule: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.rule = rule
        self.headers: Mapping[str, str] = headers or {}


def table_id_of(request: web.Request) -> str:
    """The table id a route names, if it has the shape of one (else 400, before any query)."""
    table_id = request.match_info["id"]
    if TABLE_ID.search(table_id) is None:
        raise Refused(
            400, "invalid_table_id", "a table id is 1 to 64 of the characters A-Z a-z 0-9 _ -"
        )
    return table_id


def error_response(
    status: int,
    detail: ErrorDetail,
    headers: Mapping[str, str] | None = None,
    request: web.Request | None = None,
) -> web.Response:
    """The one error shape, its message in the language the request asks for (when given)."""
    answer = dict(headers or {})
    if request is not None:
        detail, answer["Content-Language"] = localized(request, detail)
    body = _json.encode(ErrorBody(error=detail))
    return web.json_response(body=body, status=status, headers=answer)


def localized(request: web.Request, detail: ErrorDetail) -> tuple[ErrorDetail, str]:
    """``detail`` with its message in the language of the request's ``Accept-Language``
    (``shared/contracts/messages.py``), and that language."""
    language = language_of(request.headers.get("Accept-Language"))
    message = translated(detail.code, detail.message, language)
    if message != detail.message:
        detail = msgspec.structs.replace(detail, message=message)
    return detail, language


def refusal_of(exc: Exception) -> Refusal | None:
    """The status, body and headers of the refusals every service shares; None for others."""
    if isinstance(exc, Refused):
        detail = ErrorDetail(code=exc.code, message=exc.message, rule=exc.rule)
        return exc.status, detail, exc.headers
    if isinstance(exc, RateLimited):
        detail = ErrorDetail(
            code="rate_limited", message=f"too many {exc.action}: try again in a moment"
        )
        return 429, detail, {"Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, AuthError):
        return 401, ErrorDetail(code="unauthorized", message=str(exc)), {}
    if isinstance(exc, msgspec.ValidationError):
        return 400, ErrorDetail(code="invalid_request", message=str(exc)), {}
    if isinstance(exc, RecursionError):  # msgspec's decoders, on JSON nested ~1000 deep
        detail = ErrorDetail(code="malformed_json", message="the JSON is nested too deeply")
        return 400, detail, {}
    if isinstance(exc, msgspec.DecodeError):
        detail = ErrorDetail(code="malformed_json", message=f"the body is not JSON: {exc}")
        return 400, detail, {}
    return unavailable_of(exc)


QUERY_CANCELED = "57014"


def unavailable_of(exc: BaseException) -> Refusal | None:
    """503 with Retry-After for a database that is busy or away (the request changed nothing:
    a command retried with its command_id answers its first result if it did commit)."""
    if isinstance(exc, db.PoolExhausted):
        log.warning("database_pool_exhausted")
        return _unavailable("busy", "the service is busy: try again shortly", 1)
    state = (exc.sqlstate or "") if isinstance(exc, asyncpg.PostgresError) else ""
    if state == QUERY_CANCELED:  # the statement timeout: waiting behind a lock, say
        log.warning("database_statement_timeout", error=str(exc))
        return _unavailable("busy", "the service is busy: try again shortly", 1)
    if db.transient(exc):
        log.warning("database_unavailable", sqlstate=state or None, error=repr(exc))
        return _unavailable("database_unavailable", "the database is unavailable", 2)
    if state[:2] == "22":  # a data exception: a value the checks should have refused
        log.warning("database_refused_a_value", sqlstate=state, error=str(exc))
        return 400, ErrorDetail(code="invalid_request", message="a value is not valid"), {}
    return None


def _unavailable(code: str, message: str, retry_after_s: int) -> Refusal:
    return 503, ErrorDetail(code=code, message=message), {"Retry-After": str(retry_after_s)}


def whole_number(text: str | None, name: str, default: int, low: int, high: int) -> int:
    """A query or path number: ASCII digits only (``int`` also takes "١٢", "1_0" and spaces),
    within [low, high] (what its column holds); else 400."""
    if text is None:
        return default
    if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()):
        raise Refused(400, "invalid_request", f"{name} is a whole number from {low} to {high}")
    value = int(text)
    if not low <= value <= high:
        raise Refused(400, "invalid_request", f"{name} is a whole number from {low} to {high}")
    return value


async def _read_body(request: web.Request) -> None:
    """Read the body now, under the app's deadline (the handlers read it from memory then)."""
    seconds = request.app.get(BODY_READ_S, DEFAULT_BODY_READ_S)
    try:
        async with asyncio.timeout(seconds):
            await request.read()
    except TimeoutError:
        raise BodyTooSlow(f"the request's body did not arrive whole within {seconds:g} s") from None


@web.middleware
async def not_stored(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer says ``Cache-Control: no-store`` unless its handler said otherwise: a
    seat's view holds its hand, which a browser's cache on a shared phone would keep, and
    every answer is of a moment (a view, a page of a log that grows, a record that a person's
    erasure may change)."""
    response = await handler(request)
    if not response.prepared and hdrs.CACHE_CONTROL not in response.headers:
        response.headers[hdrs.CACHE_CONTROL] = "no-store"
    return response


def refusals(
    classify: Callable[[Exception], Refusal | None] = refusal_of,
    on_refused: Callable[[web.Request, int, ErrorDetail], None] | None = None,
) -> Middleware:
    """The one middleware: each request logs with its own context (starting with the table it
    names), and every refusal (``classify``, then aiohttp's own) takes the one error shape."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        structlog.contextvars.clear_contextvars()
        try:
            if "id" in request.match_info:
                structlog.contextvars.bind_contextvars(table_id=table_id_of(request))
            if request.can_read_body:
                await _read_body(request)
            return await handler(request)
        except BodyTooSlow as exc:  # 408, and the connection closed: it is the client's
            detail = ErrorDetail(code="request_timeout", message=str(exc))
            response = error_response(408, detail, request=request)
            response.force_close()
            # Sent now, then the connection closed: left to aiohttp, it would linger reading
            # the rest of the body the client is not sending.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
            return response
        except web.HTTPException as exc:  # aiohttp's own: no route, wrong method, too big
            if exc.status < 400:
                raise
            code = AIOHTTP_CODES.get(exc.status, "bad_request")
            refusal: Refusal | None = (exc.status, ErrorDetail(code=code, message=exc.reason), {})
        except Exception as exc:
            refusal = classify(exc)
            if refusal is None:
                raise
        assert refusal is not None
        status, detail, headers = refusal
        if on_refused is not None:
            on_refused(request, status, detail)
        return error_response(status, detail, headers, request)

    return middleware
