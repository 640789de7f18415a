"""Reading what a newer producer wrote: the consumers' half of the compatibility policy.

Within one ``schema_version`` every change is additive (docs/subscribing.md): new event and
command types, new fields with defaults. A consumer of ours therefore

- acknowledges and skips an event of a type it does not know (``decode_envelope`` returns an
  ``UnknownEvent`` with the envelope's identity instead of raising), and an envelope of a newer
  ``schema_version`` (a breaking version is published beside the old one, never instead);
- ignores fields it does not know: events and views already do; commands, which refuse unknown
  fields as request bodies, are read leniently here: inside a bot's view (``legal``) an
  unknown command type is left out and unknown fields are dropped, and a queued command of an
  unknown type is an ``UnknownCommand``.

Anything that is not a well-formed message at all (not JSON, nested too deeply, a missing
``id``, a known type with a field of the wrong type) still raises ``msgspec.DecodeError`` /
``ValidationError``: that is a poison message, for the dead-letter queue.

>>> wire = (b'{"id":"6f1c2a4e-0d5b-4c3e-9a7f-2b8d1e0c9a55","type":"card_juggled","table_id":"t1",'
...         b'"seq":4,"occurred_at":"2026-01-02T03:04:05Z","data":{"type":"card_juggled"}}')
>>> decode_envelope(wire).type
'card_juggled'
>>> isinstance(decode_envelope(wire), UnknownEvent)
True
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

from shared.contracts.api import BotTurn, QueuedCommand
from shared.contracts.commands import AnyCommand, Command
from shared.contracts.envelope import SCHEMA_VERSION, Envelope
from shared.contracts.events import EVENT_TYPES, AnyEvent

COMMAND_TYPES: dict[str, type[Command]] = {
    cls.__struct_config__.tag: cls for cls in AnyCommand.__args__
}


class UnknownEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An envelope this code cannot read (a newer type or schema version): skip it, once.

    It keeps the envelope's identity, so a consumer can log it and dedupe it like any other.
    """

    id: uuid.UUID
    type: str
    table_id: str
    stream: str = "table"
    seq: int
    occurred_at: datetime
    schema_version: int = SCHEMA_VERSION


class UnknownCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A queued command of a type this code does not know: acknowledge it, apply nothing."""

    table_id: str
    source: str
    type: str


class _Head(msgspec.Struct, frozen=True, kw_only=True):
    """An envelope whose ``data`` is left undecoded until its type is known."""

    id: uuid.UUID
    type: str
    table_id: str
    stream: str = "table"
    seq: int
    version: int | None = None
    occurred_at: datetime
    schema_version: int = SCHEMA_VERSION
    data: msgspec.Raw


_head_decoder = msgspec.json.Decoder(_Head)


def _untyped(body: bytes | str) -> Any:
    """JSON as Python values; ``DecodeError`` (not ``RecursionError``) when nested too deeply."""
    try:
        return msgspec.json.decode(body)
    except RecursionError:
        raise msgspec.DecodeError("JSON nested too deeply") from None


_event_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    tag: msgspec.json.Decoder(cls) for tag, cls in EVENT_TYPES.items()
}


def decode_envelope(body: bytes | str) -> Envelope | UnknownEvent:
    """An envelope, or ``UnknownEvent`` for a type or ``schema_version`` newer than this code.

    Unknown fields, in the envelope and in its event, are ignored.
    """
    try:
        head = _head_decoder.decode(body)
    except RecursionError:
        raise msgspec.DecodeError("JSON nested too deeply") from None
    decoder = _event_decoders.get(head.type)
    if decoder is None or head.schema_version > SCHEMA_VERSION:
        return UnknownEvent(
            id=head.id,
            type=head.type,
            table_id=head.table_id,
            stream=head.stream,
            seq=head.seq,
            occurred_at=head.occurred_at,
            schema_version=head.schema_version,
        )
    data: AnyEvent = decoder.decode(head.data)
    return Envelope(
        id=head.id,
        type=head.type,
        table_id=head.table_id,
        stream=head.stream,
        seq=head.seq,
        version=head.version,
        occurred_at=head.occurred_at,
        schema_version=head.schema_version,
        data=data,
    )


def _known_fields(obj: dict[str, Any]) -> tuple[type[Command], dict[str, Any]] | None:
    """A command object's type and only the fields that type has; None for an unknown type."""
    cls = COMMAND_TYPES.get(obj.get("type"))  # type: ignore[arg-type]
    if cls is None:
        return None
    names = set(cls.__struct_fields__) | {"type"}
    return cls, {key: value for key, value in obj.items() if key in names}


def decode_queued_command(body: bytes | str) -> QueuedCommand | UnknownCommand:
    """A command from ``gin.commands``; ``UnknownCommand`` for a type this code does not know."""
    obj = _untyped(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("command"), dict):
        raise msgspec.ValidationError("a queued command is an object with a command object")
    known = _known_fields(obj["command"])
    if known is None:
        return UnknownCommand(
            table_id=str(obj.get("table_id")),
            source=str(obj.get("source")),
            type=str(obj["command"].get("type")),
        )
    return msgspec.convert({**obj, "command": known[1]}, QueuedCommand)


def decode_bot_turn(body: bytes | str) -> BotTurn:
    """A bot turn; in its view's ``legal``, commands of unknown types are left out and unknown
    fields dropped (a bot that picks from ``legal`` only ever sends what it knows)."""
    obj = _untyped(body)
    view = obj.get("view") if isinstance(obj, dict) else None
    legal = view.get("legal") if isinstance(view, dict) else None
    if isinstance(view, dict) and isinstance(legal, list):
        kept: list[Any] = []
        for entry in legal:
            known = _known_fields(entry) if isinstance(entry, dict) else (Command, entry)
            if known is not None:  # not an object: kept, for convert to refuse
                kept.append(known[1])
        obj = {**obj, "view": {**view, "legal": kept}}
    return msgspec.convert(obj, BotTurn)
