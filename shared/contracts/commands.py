"""Commands: what a seat (or the timer service) asks of a table. One Struct per command.

Each is the complete body a client sends, tagged by ``type``. ``command_id`` makes a retry
safe; ``expected_version`` refuses a command built on a stale view. The ``legal`` list of a
view holds these same Structs without either, so a client that picks from it is never refused.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

CardText = Annotated[str, msgspec.Meta(min_length=1, max_length=4)]
# A client's own retry key: 1 to 100 of A-Z a-z 0-9 . _ : ~ - (a UUID fits). Ids are scoped by
# who sends them, so a person's id never meets a bot's or the timer service's.
COMMAND_ID_PATTERN = r"^[A-Za-z0-9._:~-]{1,100}(?!\n)$"
CommandId = Annotated[str, msgspec.Meta(pattern=COMMAND_ID_PATTERN)]
Meld = Annotated[list[CardText], msgspec.Meta(max_length=11)]
# A table's version is a PostgreSQL integer.
MAX_VERSION = 2**31 - 1


class Command(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag_field="type",
    omit_defaults=True,
    forbid_unknown_fields=True,
):
    """Fields every command may carry."""

    command_id: CommandId | None = None
    expected_version: Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)] | None = None


class TakeUpcard(Command, tag="take_upcard", frozen=True, kw_only=True):
    """Take the face-up card offered at the start of a hand (R4)."""


class PassUpcard(Command, tag="pass_upcard", frozen=True, kw_only=True):
    """Decline the upcard (R4)."""


class Draw(Command, tag="draw", frozen=True, kw_only=True):
    """Draw the top card of the stock or of the discard pile (R5.1)."""

    source: Literal["stock", "discard"]


class Discard(Command, tag="discard", frozen=True, kw_only=True):
    """End the turn by discarding a card face up (R5.2)."""

    card: CardText


class Knock(Command, tag="knock", frozen=True, kw_only=True):
    """Knock, or go gin when the deadwood left is 0 (R6.1, R6.2).

    Without ``card`` the server picks the discard (R6.5); without ``melds`` it lays the best
    arrangement (R6.4). ``deadwood`` is informative in ``legal`` and ignored when sent.
    """

    card: CardText | None = None
    melds: Annotated[list[Meld], msgspec.Meta(max_length=11)] | None = None
    deadwood: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None


class BigGin(Command, tag="big_gin", frozen=True, kw_only=True):
    """Show 11 melded cards without discarding (R6.3)."""


class Resign(Command, tag="resign", frozen=True, kw_only=True):
    """Give up the match: the opponent wins (DESISTIR, R9.3)."""


class Leave(Command, tag="leave", frozen=True, kw_only=True):
    """Leave the table: mid-match the opponent wins; after a match it declines the rematch."""


class ClaimAbsence(Command, tag="claim_absence", frozen=True, kw_only=True):
    """End the match because the opponent has not acted for the absence time (R10.2)."""


class Rematch(Command, tag="rematch", frozen=True, kw_only=True):
    """Offer a rematch, or accept the one offered (R9.4)."""


class DeclineRematch(Command, tag="decline_rematch", frozen=True, kw_only=True):
    """Refuse a rematch: the table closes (R9.4)."""


class Expire(Command, tag="expire", frozen=True, kw_only=True):
    """From the timer service: close a table with no accepted command for the expiry time."""


AnyCommand = (
    TakeUpcard
    | PassUpcard
    | Draw
    | Discard
    | Knock
    | BigGin
    | Resign
    | Leave
    | ClaimAbsence
    | Rematch
    | DeclineRematch
    | Expire
)
PLAYER_COMMANDS: tuple[type[Command], ...] = (
    TakeUpcard,
    PassUpcard,
    Draw,
    Discard,
    Knock,
    BigGin,
    Resign,
    Leave,
    ClaimAbsence,
    Rematch,
    DeclineRematch,
)

command_decoder = msgspec.json.Decoder(AnyCommand)
