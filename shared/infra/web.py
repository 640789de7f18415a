"""The HTTP edge every service shares: the one error shape, refusals, per-request log context.

A refused request answers ``{"error": {"code", "message", "rule"}}`` with a 4xx and changes
nothing. Each service adds its own refusals (the engine's, say) through ``classify``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import msgspec
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from shared.contracts.api import ErrorBody, ErrorDetail
from shared.infra.auth import AuthError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refusal = tuple[int, ErrorDetail, Mapping[str, str]]
_json = msgspec.json.Encoder()
AIOHTTP_CODES = {404: "no_such_route", 405: "method_not_allowed", 413: "body_too_large"}


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


def error_response(
    status: int, detail: ErrorDetail, headers: Mapping[str, str] | None = None
) -> web.Response:
    """The one error shape."""
    body = _json.encode(ErrorBody(error=detail))
    return web.json_response(body=body, status=status, headers=dict(headers or {}))


def refusal_of(exc: Exception) -> Refusal | None:
    """The status, body and headers of the refusals every service shares; None for others."""
    if isinstance(exc, Refused):
        detail = ErrorDetail(code=exc.code, message=exc.message, rule=exc.rule)
        return exc.status, detail, exc.headers
    if isinstance(exc, AuthError):
        return 401, ErrorDetail(code="unauthorized", message=str(exc)), {}
    if isinstance(exc, msgspec.ValidationError):
        return 400, ErrorDetail(code="invalid_request", message=str(exc)), {}
    if isinstance(exc, msgspec.DecodeError):
        detail = ErrorDetail(code="malformed_json", message=f"the body is not JSON: {exc}")
        return 400, detail, {}
    return None


def refusals(
    classify: Callable[[Exception], Refusal | None] = refusal_of,
    on_refused: Callable[[web.Request, int, ErrorDetail], None] | None = None,
) -> Middleware:
    """The one middleware: each request logs with its own context (starting with the table it
    names), and every refusal (``classify``, then aiohttp's own) takes the one error shape."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        structlog.contextvars.clear_contextvars()
        if "id" in request.match_info:
            structlog.contextvars.bind_contextvars(table_id=request.match_info["id"])
        try:
            return await handler(request)
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
        return error_response(status, detail, headers)

    return middleware
