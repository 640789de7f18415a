"""Bodies of the v1 HTTP and WebSocket API (docs/DESIGN.md section 7) and of the work queues."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from shared.contracts.commands import AnyCommand
from shared.contracts.envelope import Envelope
from shared.contracts.events import BotLevel, Player
from shared.contracts.options import StrictTableOptions, TableOptions
from shared.contracts.views import TableStatus, TableView

DeckDesign = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")]
# Python's ``$`` also matches before a final newline (ECMA's, in the schema, does not):
# ``(?!\n)`` makes both read a pattern the same way.
# The shapes of what a client names, checked before any database call. The service makes
# table ids of 12 and invitation codes of 22 URL-safe characters (secrets.token_urlsafe).
TABLE_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}(?!\n)$"
INVITE_CODE_PATTERN = r"^[A-Za-z0-9_-]{1,64}(?!\n)$"
InviteCode = Annotated[str, msgspec.Meta(pattern=INVITE_CODE_PATTERN)]
# Positions in a log (``after``) are PostgreSQL bigints; hand numbers are integers.
MAX_SEQ = 2**63 - 1
MAX_HAND = 2**31 - 1


class Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request body: unknown fields are refused."""


class CreateTable(Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/tables``."""

    options: StrictTableOptions = msgspec.field(default_factory=StrictTableOptions)


class JoinTable(Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/tables/{id}/join``."""

    invite_code: InviteCode


class SeatBot(Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/tables/{id}/bot``."""

    level: BotLevel


class Preferences(Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``GET`` / ``PUT /v1/players/me/preferences``."""

    deck_design: DeckDesign


class MintToken(Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/dev/tokens`` (development only)."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[^\x00-\x1f\x7f]{1,60}(?!\n)$")]
    sub: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:@~-]{1,100}(?!\n)$")] | None = None


class Token(msgspec.Struct, frozen=True, kw_only=True):
    """A minted development token."""

    token: str
    sub: str
    name: str


class TableCreatedResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to ``POST /v1/tables``."""

    table_id: str
    invite_code: str
    invite_url: str
    seat: int
    view: TableView


class CommandResult(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to an accepted command: the new version, its events, the caller's view."""

    version: int
    events: list[Envelope]
    view: TableView


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    """What was refused and why; ``rule`` names the rule of docs/RULES.md when there is one."""

    code: str
    message: str
    rule: str | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """``{"error": {...}}``: every refusal."""

    error: ErrorDetail


class BotTurn(msgspec.Struct, frozen=True, kw_only=True):
    """A bot seat must act: its own view (never more), on ``gin.bots`` key ``bot.<level>``."""

    table_id: str
    seat: int
    level: BotLevel
    version: int
    view: TableView


class QueuedCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A command on ``gin.commands``: a bot's move, or the timer service's expiry."""

    table_id: str
    source: Literal["bot", "timer"]
    seat: int | None = None
    command: AnyCommand


class WsCommand(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="command"):
    """A command sent over the table WebSocket by a seated client."""

    command: AnyCommand


class WsSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="snapshot"):
    """The first WebSocket message: the whole current view."""

    view: TableView


class WsEvent(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="event", omit_defaults=True
):
    """One event of the table (or its chat), with the viewer's new view for table events."""

    event: Envelope
    view: TableView | None = None


class WsResult(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="result"):
    """The answer to a WebSocket command."""

    result: CommandResult


class WsError(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="error"):
    """A refused WebSocket command or a bad message."""

    error: ErrorDetail


# --- the caller's tables: GET /v1/players/me/tables and the player socket --------------------

# Which of the caller's tables a list holds (``?status=``): the open ones (waiting, playing,
# match_over), the finished ones (closed, expired) or both.
ListStatus = Literal["open", "finished", "all"]
MAX_LIST_LIMIT = 100  # entries a page holds at most (``?limit=``)
LIST_LIMIT = 20  # and without ``?limit=``


class MyTable(msgspec.Struct, frozen=True, kw_only=True):
    """One of the caller's tables in their list: whose turn it is, since when, and when the
    absence rule (R10.2) and expiry (R10.3) fall due."""

    table_id: str
    status: TableStatus
    seats: list[Player | None]  # each seat's name (a pseudonym for an erased person)
    you: int
    to_act: int | None  # the seat that has the decision (None: no hand on)
    my_turn: bool
    turn_since: datetime | None  # when ``to_act`` got the decision
    absence_claimable_at: datetime | None  # turn_since plus the absence delay (R10.2)
    expires_at: datetime | None  # the last move plus the expiry delay (R10.3); open tables
    scores: list[int]
    options: TableOptions


class MyTables(msgspec.Struct, frozen=True, kw_only=True):
    """A page of the caller's tables, theirs to play first, then the longest waiting; ``next``
    is the cursor of the next page (None: this is the last)."""

    tables: list[MyTable]
    next: str | None


class PlayerTables(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="tables"):
    """The player socket's first message: the first page of the caller's open tables."""

    tables: list[MyTable]
    next: str | None


class PlayerTable(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="table"):
    """One of the caller's tables changed turn or status (or became theirs): its entry now."""

    table: MyTable
