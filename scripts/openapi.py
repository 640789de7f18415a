#!/usr/bin/env python3
"""``make openapi``: the OpenAPI 3.1 document of the HTTP API (docs/DESIGN.md section 7).

Prints ``docs/openapi.yaml``: the table service's v1 routes, the chat service's, and the
operational routes every service answers. Bodies are msgspec's JSON Schema of the Structs the
handlers decode and encode. ``tests/deploy/test_contract_docs.py`` fails when the committed
file differs from a fresh one, and when a route the services register is missing here (or a
route here is registered by none).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from asyncapi import render  # a sibling script, not a package

from services.chat.http import PostMessage
from services.table import ws
from shared.contracts import api
from shared.contracts.api import (
    LIST_LIMIT,
    MAX_HAND,
    MAX_LIST_LIMIT,
    MAX_SEQ,
    TABLE_ID_PATTERN,
)
from shared.contracts.commands import AnyCommand
from shared.contracts.envelope import Envelope
from shared.contracts.events import HandEnded
from shared.contracts.views import TableView
from shared.infra.settings import Settings

SCHEMAS = "#/components/schemas/{name}"
Service = Literal["table", "chat", "ops"]
Auth = Literal["required", "optional", "none"]

# Every Struct a body is made of, by the name the document gives it.
BODY_TYPES: dict[str, Any] = {
    "CreateTable": api.CreateTable,
    "TableCreatedResponse": api.TableCreatedResponse,
    "JoinTable": api.JoinTable,
    "SeatBot": api.SeatBot,
    "CommandResult": api.CommandResult,
    "TableView": TableView,
    "AnyCommand": AnyCommand,
    "Envelope": Envelope,
    "HandEnded": HandEnded,
    "Preferences": api.Preferences,
    "MintToken": api.MintToken,
    "Token": api.Token,
    "ErrorBody": api.ErrorBody,
    "PostMessage": PostMessage,
    "WsCommand": api.WsCommand,
    "WsSnapshot": api.WsSnapshot,
    "WsEvent": api.WsEvent,
    "WsResult": api.WsResult,
    "WsError": api.WsError,
    "MyTables": api.MyTables,
    "PlayerTables": api.PlayerTables,
    "PlayerTable": api.PlayerTable,
}
# Bodies that are no Struct of the code.
EXTRA_SCHEMAS: dict[str, Any] = {
    "PreferencesView": {
        "title": "PreferencesView",
        "description": "A player's cosmetic preferences; null until the player chose.",
        "type": "object",
        "properties": {"deck_design": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["deck_design"],
    },
    "Health": {
        "title": "Health",
        "description": "The process answers.",
        "type": "object",
        "properties": {"status": {"const": "ok"}},
        "required": ["status"],
    },
    "Readiness": {
        "title": "Readiness",
        "description": "Each dependency's check (`ok` or `failing: ...`).",
        "type": "object",
        "properties": {
            "status": {"enum": ["ready", "not_ready"]},
            "checks": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["status", "checks"],
    },
}
MAX_BODY_KIB = Settings().max_body_bytes // 1024
ERRORS = {
    400: "Malformed or invalid (`malformed_json`, `invalid_request`, `invalid_table_id`, "
    "`unknown_command`, `invalid_cursor`, `invalid_list_status`, ...).",
    401: "No token, or a token that is not valid (`unauthorized`).",
    403: "Not allowed to this caller (`not_seated`, `not_creator`, `bad_invite_code`, ...).",
    404: "No such table (`no_such_table`) or hand (`no_such_hand`).",
    409: "Not now: the rules refuse it (`not_your_turn`, `seat_taken`, `table_closed`, ...).",
    413: f"The body is larger than {MAX_BODY_KIB} KiB (`body_too_large`).",
    429: "Too many of these from this identity (a per-identity rate limit, or the chat's "
    "`too_many_messages`): wait `Retry-After` seconds. A `rate_limited` client that asks again "
    "anyway is answered no faster than a few refusals a second (each held up to 5 s).",
    503: "Busy or its database unavailable, nothing changed: retry after `Retry-After` seconds "
    "(`busy`, `database_unavailable`).",
}
CLOSE_INVALID_TEXT = 1007  # aiohttp's, for a text frame that is not UTF-8 (RFC 6455 7.4.1)
# Refusals that carry Retry-After (whole seconds).
RETRY_AFTER = (429, 503)


@dataclass(frozen=True)
class Param:
    """A path or query parameter."""

    name: str
    where: Literal["path", "query"]
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})


@dataclass(frozen=True)
class Op:
    """One operation of one route."""

    method: str
    path: str
    service: Service
    operation_id: str
    summary: str
    description: str = ""
    auth: Auth = "none"
    body: str | None = None
    body_required: bool = True
    ok: tuple[int, str, str | None] = (200, "OK", None)  # status, description, schema name
    ok_array: bool = False
    errors: tuple[int, ...] = ()
    params: tuple[Param, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


TABLE_ID = Param(
    "id",
    "path",
    "The table's id (the service makes them of 12 characters; any other of this shape names "
    "no table).",
    {"type": "string", "pattern": TABLE_ID_PATTERN},
)
AFTER = Param(
    "after",
    "query",
    "Only what is numbered above this.",
    {"type": "integer", "minimum": 0, "maximum": MAX_SEQ, "default": 0},
)


def limit(default: int, page: int) -> Param:
    """The ``limit`` query parameter of a page: a larger one than the page gets the page."""
    schema = {"type": "integer", "minimum": 1, "maximum": MAX_SEQ, "default": default}
    return Param("limit", "query", f"At most this many (a page holds at most {page}).", schema)


OPS: tuple[Op, ...] = (
    Op(
        "post",
        "/v1/tables",
        "table",
        "createTable",
        "Create a table; the caller sits in seat 0.",
        "The answer carries the invitation code and link for the second player.",
        auth="required",
        body="CreateTable",
        body_required=False,
        ok=(201, "The table, its invitation and the caller's view.", "TableCreatedResponse"),
        errors=(400, 401, 413, 429, 503),
    ),
    Op(
        "post",
        "/v1/tables/{id}/join",
        "table",
        "joinTable",
        "Take the free seat with the invitation code.",
        "409 `seat_taken` once both seats are taken: the caller can still watch.",
        auth="required",
        body="JoinTable",
        ok=(200, "The caller's new view and the events of the join.", "CommandResult"),
        errors=(400, 401, 403, 404, 409, 413, 429, 503),
        params=(TABLE_ID,),
    ),
    Op(
        "post",
        "/v1/tables/{id}/bot",
        "table",
        "seatBot",
        "Fill the free seat with a bot (`tito`, `carmen` or `luna`); the creator only.",
        auth="required",
        body="SeatBot",
        ok=(200, "The caller's new view and the events.", "CommandResult"),
        errors=(400, 401, 403, 404, 409, 413, 429, 503),
        params=(TABLE_ID,),
    ),
    Op(
        "get",
        "/v1/tables/{id}",
        "table",
        "getTable",
        "The caller's view: a seat's view for a seated player, the public view otherwise.",
        auth="optional",
        ok=(200, "The view.", "TableView"),
        errors=(400, 401, 404, 503),
        params=(TABLE_ID,),
    ),
    Op(
        "post",
        "/v1/tables/{id}/commands",
        "table",
        "postCommand",
        "Apply one command of a seated player.",
        "Every entry of the view's `legal` is a complete body. Add a `command_id` to make a "
        "retry safe: a retry with the same `command_id` within `GIN_COMMAND_RETENTION_S` (a "
        "day) of the first answer gets that answer again, unchanged, and changes nothing; after "
        "that the id is forgotten and a retry is decided as a new command. Add "
        "`expected_version` to refuse a stale view; it also makes a retry later than the "
        "retention safe, since it is then refused with 409 `stale_version`, never applied twice.",
        auth="required",
        body="AnyCommand",
        ok=(200, "The new version, the events and the caller's new view.", "CommandResult"),
        errors=(400, 401, 403, 404, 409, 413, 429, 503),
        params=(TABLE_ID,),
    ),
    Op(
        "get",
        "/v1/tables/{id}/events",
        "table",
        "getEvents",
        "The table's public events with `seq` above `after`, to catch up after a reconnect.",
        ok=(200, "The envelopes, in `seq` order.", "Envelope"),
        ok_array=True,
        errors=(400, 404, 503),
        params=(TABLE_ID, AFTER, limit(1000, 1000)),
    ),
    Op(
        "get",
        "/v1/tables/{id}/hands/{n}",
        "table",
        "getHand",
        "The full record of a finished hand, deck and salt included (R11.3).",
        ok=(200, "The hand_ended event of that hand.", "HandEnded"),
        errors=(400, 404, 503),
        params=(
            TABLE_ID,
            Param(
                "n",
                "path",
                "The hand's number.",
                {"type": "integer", "minimum": 1, "maximum": MAX_HAND},
            ),
        ),
    ),
    Op(
        "get",
        "/v1/tables/{id}/ws",
        "table",
        "tableSocket",
        "Watch a table over a WebSocket; a seated client may send commands on it too.",
        "The server sends a `snapshot` first, then an `event` (with the viewer's new view) for "
        'every event and chat message of the table; a command sent as `{"kind": "command", '
        '"command": {...}}` is answered by a `result` or an `error` (any other text or a '
        "binary frame by an `error`). Authenticate with `?token=` (browsers cannot set headers "
        "on a WebSocket); a plain GET, not an upgrade, is refused with 400. The close codes "
        "are listed in `x-websocket.close-codes`: after 1001 or 4008 reconnect and catch up "
        "with `getEvents`; after 4001 reconnect with a fresh token; after 1013, sent at once "
        "by a replica with no room for another socket, reconnect in a few seconds. A "
        "`snapshot` may come again on an open socket (its replica may have missed chat or "
        "notices): read the events and the messages past your newest ones, as after a "
        "reconnect.",
        auth="optional",
        ok=(101, "Switching Protocols: the WebSocket is open.", None),
        errors=(400, 401, 404, 429, 503),
        params=(
            TABLE_ID,
            Param("token", "query", "The bearer token, for a seated player or a named viewer."),
        ),
        extra={
            "x-websocket": {
                "server-messages": [
                    {"$ref": SCHEMAS.format(name=n)}
                    for n in ("WsSnapshot", "WsEvent", "WsResult", "WsError")
                ],
                "client-messages": [{"$ref": SCHEMAS.format(name="WsCommand")}],
                "max-message-bytes": Settings().ws_max_frame_bytes,
                "close-codes": {
                    str(code): meaning
                    for code, meaning in (
                        (ws.CLOSE_GOING_AWAY, "This replica shuts down: reconnect to another."),
                        (CLOSE_INVALID_TEXT, "A text frame that is not UTF-8."),
                        (ws.CLOSE_MESSAGE_TOO_BIG, "A message larger than `max-message-bytes`."),
                        (
                            ws.CLOSE_TRY_AGAIN_LATER,
                            "At once, before the snapshot: the replica has no room for another"
                            " socket (its open files, GIN_MAX_SOCKETS, or its memory near its"
                            " limit). Reconnect in a few seconds.",
                        ),
                        (ws.CLOSE_TOKEN_EXPIRED, "The token expired: reconnect with a new one."),
                        (ws.CLOSE_TOO_SLOW, "The client fell behind: resume by seq."),
                        (
                            ws.CLOSE_ARCHIVED,
                            "The table was archived: `GET /v1/tables/{id}` answers 410 and"
                            " says where its record is.",
                        ),
                    )
                },
            }
        },
    ),
    Op(
        "get",
        "/v1/players/me/tables",
        "table",
        "getMyTables",
        "The caller's tables: theirs to play first, then the longest waiting; a page.",
        "Each entry: `table_id`, `status`, `seats`, `you`, `to_act` (the seat with the decision"
        " while a hand is on), `my_turn`, `turn_since`, `absence_claimable_at` (`turn_since`"
        " plus `GIN_ABSENCE_AFTER_S`, 48 h: R10.2), `expires_at` (the last move plus"
        " `GIN_EXPIRY_AFTER_S`, 7 days: R10.3; open tables only), `scores` and `options`. Order:"
        " the tables where the caller has the decision, then the other open ones, then (with"
        " `status=finished` or `all`) the finished ones; in each, the oldest `turn_since` (else"
        " last move) first, then `table_id`. `next` is an opaque cursor for `after` (null on the"
        " last page), good only for its caller and its `status`. Paging while play goes on: the"
        " tables unchanged since the first page keep their places; those changed since (made,"
        " moved, ended) come after them, oldest change first: none is missed, and one that"
        " changed after it was sent comes again with its entry then (keep the last entry of"
        " each `table_id`). Counted against the `lists` limit (`GIN_RATE_LISTS`).",
        auth="required",
        ok=(200, "A page of the caller's tables.", "MyTables"),
        errors=(400, 401, 429, 503),
        params=(
            Param(
                "status",
                "query",
                "`open` (waiting, playing, match_over), `finished` (closed, expired) or `all`;"
                " else 400 `invalid_list_status`.",
                {"enum": ["open", "finished", "all"], "default": "open"},
            ),
            Param(
                "limit",
                "query",
                "Entries in the page (else 400 `invalid_request`).",
                {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_LIST_LIMIT,
                    "default": LIST_LIMIT,
                },
            ),
            Param(
                "after",
                "query",
                "The `next` of the page before; one not given to this caller for this `status`"
                " is refused with 400 `invalid_cursor`.",
            ),
        ),
    ),
    Op(
        "get",
        "/v1/players/me/ws",
        "table",
        "playerSocket",
        "The caller's tables as they change, over a WebSocket: a lobby without polling.",
        "The server sends `tables` first (the first page of the caller's open tables, as"
        " `getMyTables` gives it), then `table` (one entry, as in the list) each time one of the"
        " caller's tables changes turn, status or seating, or a new one becomes theirs (created,"
        " or a seat taken). Any replica serves it. It takes no messages (each is answered with"
        " an `error`). Authenticate with `?token=` (or the header); admitted, limited (`sockets`)"
        " and closed as `tableSocket` is (its `x-websocket.close-codes`, but 4410); after a"
        " reconnect, its first message is the list again. The list may also come again on an"
        " open socket (its replica may have missed changes), as after a reconnect: its first"
        " page, with `next` for the later ones.",
        auth="required",
        ok=(101, "Switching Protocols: the WebSocket is open.", None),
        errors=(400, 401, 429, 503),
        params=(Param("token", "query", "The bearer token."),),
        extra={
            "x-websocket": {
                "server-messages": [
                    {"$ref": SCHEMAS.format(name=n)}
                    for n in ("PlayerTables", "PlayerTable", "WsError")
                ],
                "client-messages": [],
                "max-message-bytes": Settings().ws_max_frame_bytes,
            }
        },
    ),
    Op(
        "get",
        "/v1/players/me/preferences",
        "table",
        "getPreferences",
        "The caller's cosmetic preferences (R10.7).",
        auth="required",
        ok=(200, "The preferences.", "PreferencesView"),
        errors=(401, 503),
    ),
    Op(
        "put",
        "/v1/players/me/preferences",
        "table",
        "putPreferences",
        "Set the caller's deck design; it shows in that player's views (R10.7).",
        auth="required",
        body="Preferences",
        ok=(200, "The preferences now.", "Preferences"),
        errors=(400, 401, 413, 503),
    ),
    Op(
        "delete",
        "/v1/players/me",
        "table",
        "erasePlayer",
        "Erase the caller's personal data (LGPD art. 18); 204 every time.",
        'Every seat the caller holds becomes a pseudonym ("Jogador removido", an '
        "`erased-...` id) in the tables, their events and answers; a match on is ended first as "
        "if the caller had left; preferences are deleted. Each table gets a `player_erased` "
        "event (docs/asyncapi.yaml), and the chat deletes the caller's messages. The token "
        "still works: its holder is someone with no seat. A second call changes nothing.",
        auth="required",
        ok=(204, "Erased (or nothing left to erase).", None),
        errors=(401, 429, 503),
    ),
    Op(
        "post",
        "/v1/dev/tokens",
        "table",
        "mintToken",
        "Development only: mint a token.",
        "The route exists only when `GIN_DEV_TOKENS` is true; production tokens are signed by "
        "the site.",
        body="MintToken",
        ok=(201, "A token for `Authorization: Bearer`.", "Token"),
        errors=(400, 413),
    ),
    Op(
        "post",
        "/v1/tables/{id}/messages",
        "chat",
        "postMessage",
        "Write in the table's chat (seated players only).",
        "Spectators get 403 `spectators_cannot_chat`. A client that sends `after_version` (the "
        "table version it has seen, say the join's) is answered once the chat has caught up with "
        "that version (it learns seats from the table's events, milliseconds later), at most about "
        "2 s, else 503 `chat_catching_up` with `Retry-After`: a person seated at that version is "
        "never refused.",
        auth="required",
        body="PostMessage",
        ok=(201, "The message's `message_posted` envelope.", "Envelope"),
        errors=(400, 401, 403, 404, 409, 413, 429, 503),
        params=(TABLE_ID,),
    ),
    Op(
        "get",
        "/v1/tables/{id}/messages",
        "chat",
        "getMessages",
        "The table's chat history after `after`, for anyone.",
        ok=(200, "The `message_posted` envelopes, in order.", "Envelope"),
        ok_array=True,
        errors=(400, 404, 503),
        params=(TABLE_ID, AFTER, limit(50, 100)),
    ),
    Op(
        "get",
        "/healthz",
        "ops",
        "healthz",
        "Liveness: the process answers.",
        ok=(200, "Alive.", "Health"),
    ),
    Op(
        "get",
        "/readyz",
        "ops",
        "readyz",
        "Readiness: 200 only when every dependency (PostgreSQL, RabbitMQ) answers in time.",
        ok=(200, "Ready.", "Readiness"),
    ),
    Op(
        "get",
        "/metrics",
        "ops",
        "metrics",
        "Prometheus metrics (text exposition format).",
    ),
)

SERVICE_URLS = {
    "table": "http://127.0.0.1:8080",
    "chat": "http://127.0.0.1:8081",
    "timers": "http://127.0.0.1:8082",
    "bots": "http://127.0.0.1:8083",
}
# Where each group of routes is served (make dev's ports; the deployment's Services use the same).
SERVERS: dict[Service, list[dict[str, str]]] = {
    "table": [{"url": SERVICE_URLS["table"], "description": "The table service."}],
    "chat": [{"url": SERVICE_URLS["chat"], "description": "The chat service."}],
    "ops": [
        {"url": url, "description": f"The {name} service."} for name, url in SERVICE_URLS.items()
    ],
}
DESCRIPTION = """\
The HTTP and WebSocket API of selminha.com's Gin Rummy backend (docs/DESIGN.md section 7): the table
service (tables, seats, commands, views, events) and the chat service (messages), and the
routes every service answers for operations (`/healthz`, `/readyz`, `/metrics`).

JSON everywhere. Players send `Authorization: Bearer <token>`: an HS256 JWT signed by the site
with `sub` and `name`. Every refusal is `{"error": {"code", "message", "rule"}}` (`rule` names
the rule of docs/RULES.md when there is one) and changes nothing. The `code` is the contract; the
`message` is for people, in Brazilian Portuguese when `Accept-Language` asks for `pt` (by its
q-values), else in English, and `Content-Language` names which. Generated by `make openapi` from
the contract Structs: do not edit by hand.
"""


def error_response(status: int) -> dict[str, Any]:
    """A refusal: the one error shape of docs/DESIGN.md section 2."""
    body: dict[str, Any] = {
        "description": ERRORS[status],
        "content": {"application/json": {"schema": {"$ref": SCHEMAS.format(name="ErrorBody")}}},
    }
    body["headers"] = {
        "Content-Language": {
            "description": "The language of the message: `pt-BR` or `en` (by `Accept-Language`).",
            "schema": {"type": "string", "enum": ["en", "pt-BR"]},
        }
    }
    if status in RETRY_AFTER:
        body["headers"]["Retry-After"] = {
            "description": "Whole seconds.",
            "required": True,
            "schema": {"type": "integer", "minimum": 0},
        }
    return body


def json_content(schema_name: str, array: bool = False) -> dict[str, Any]:
    """A JSON body of one schema (or a list of it)."""
    schema: dict[str, Any] = {"$ref": SCHEMAS.format(name=schema_name)}
    if array:
        schema = {"type": "array", "items": schema}
    return {"application/json": {"schema": schema}}


def operation(op: Op) -> dict[str, Any]:
    """The OpenAPI operation object of one ``Op``."""
    out: dict[str, Any] = {"tags": [op.service], "operationId": op.operation_id}
    out["summary"] = op.summary
    if op.description:
        out["description"] = op.description
    if op.auth == "required":
        out["security"] = [{"bearerAuth": []}]
    elif op.auth == "optional":
        out["security"] = [{}, {"bearerAuth": []}]
    if op.params:
        out["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.where == "path",
                "description": p.description,
                "schema": p.schema,
            }
            for p in op.params
        ]
    if op.body is not None:
        out["requestBody"] = {"required": op.body_required, "content": json_content(op.body)}
    status, description, schema = op.ok
    responses: dict[str, Any] = {str(status): {"description": description}}
    if schema is not None:
        responses[str(status)]["content"] = json_content(schema, op.ok_array)
    if op.operation_id == "readyz":
        responses["503"] = {
            "description": "Not ready: a dependency fails.",
            "content": json_content("Readiness"),
        }
    if op.operation_id == "metrics":
        responses["200"]["content"] = {"text/plain; version=0.0.4": {"schema": {"type": "string"}}}
    for error in op.errors:
        responses[str(error)] = error_response(error)
    out["responses"] = responses
    out.update({k: v for k, v in op.extra.items() if k.startswith("x-")})
    return out


def schemas() -> dict[str, Any]:
    """msgspec's JSON Schema of every body, by name, and the few bodies that are no Struct."""
    names = list(BODY_TYPES)
    refs, components = msgspec.json.schema_components(
        [BODY_TYPES[n] for n in names], ref_template=SCHEMAS
    )
    for name, ref in zip(names, refs, strict=True):
        if ref != {"$ref": SCHEMAS.format(name=name)}:  # a union: no component of its own
            components[name] = {"title": name, **ref}
    components.update(EXTRA_SCHEMAS)
    return {name: components[name] for name in sorted(components)}


def paths() -> dict[str, Any]:
    """Every route, in the order of ``OPS``; each path with its service's servers."""
    out: dict[str, Any] = {}
    for op in OPS:
        item = out.setdefault(op.path, {"servers": SERVERS[op.service]})
        item[op.method] = operation(op)
    return out


def document() -> dict[str, Any]:
    """The whole OpenAPI document."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "Selminha Gin HTTP API", "version": "1.0.0", "description": DESCRIPTION},
        "servers": SERVERS["table"],
        "tags": [
            {"name": "table", "description": "The table service."},
            {"name": "chat", "description": "The chat service."},
            {"name": "ops", "description": "Health, readiness and metrics of every service."},
        ],
        "paths": paths(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
            "schemas": schemas(),
        },
    }


HEADER = "# Generated from shared/contracts by `make openapi`: do not edit.\n"


def main() -> None:
    """Print the document."""
    sys.stdout.write(render(document(), HEADER))


if __name__ == "__main__":
    main()
