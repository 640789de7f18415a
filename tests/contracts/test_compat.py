"""The consumers' half of the compatibility policy (``shared.contracts.compat``).

Payloads of a "future" version of the contracts: a new event type, new fields in the envelope
and in every event, a newer ``schema_version``, a new command type and new command fields in a
bot's ``legal`` and on ``gin.commands``. Each must be skipped or read, never refused; a
message that is not ours at all must still be refused (the dead-letter queue's).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import msgspec
import pytest

from services.bots.strategies import STRATEGIES
from shared.contracts import commands as c
from shared.contracts import events as e
from shared.contracts.api import BotTurn, QueuedCommand
from shared.contracts.compat import (
    UnknownCommand,
    UnknownEvent,
    decode_bot_turn,
    decode_envelope,
    decode_queued_command,
)
from shared.contracts.envelope import SCHEMA_VERSION, Envelope, envelope_decoder
from tests.contracts.test_contracts import OLD_PAYLOADS

ID = "6f1c2a4e-0d5b-4c3e-9a7f-2b8d1e0c9a55"


def envelope(data: dict[str, Any], **fields: Any) -> bytes:
    body = {
        "id": ID,
        "type": data["type"],
        "table_id": "t1",
        "seq": 3,
        "occurred_at": "2026-01-02T03:04:05Z",
        "schema_version": SCHEMA_VERSION,
        "data": data,
        **fields,
    }
    return msgspec.json.encode(body)


def test_an_unknown_event_type_is_an_unknown_event_with_its_identity() -> None:
    wire = envelope({"type": "card_juggled", "hand": 1, "how": {"high": True}}, stream="table")
    with pytest.raises(msgspec.ValidationError):  # the strict decoder refuses it
        envelope_decoder.decode(wire)
    got = decode_envelope(wire)
    assert got == UnknownEvent(
        id=uuid.UUID(ID),
        type="card_juggled",
        table_id="t1",
        stream="table",
        seq=3,
        occurred_at=got.occurred_at,
        schema_version=SCHEMA_VERSION,
    )


def test_a_newer_schema_version_is_skipped_even_for_a_known_type() -> None:
    data = msgspec.json.decode(OLD_PAYLOADS["seat_taken"])
    got = decode_envelope(envelope(data, schema_version=SCHEMA_VERSION + 1))
    assert isinstance(got, UnknownEvent)
    assert (got.type, got.schema_version) == ("seat_taken", SCHEMA_VERSION + 1)


@pytest.mark.parametrize("name", sorted(OLD_PAYLOADS))
def test_every_event_with_future_fields_reads_as_today(name: str) -> None:
    data = msgspec.json.decode(OLD_PAYLOADS[name])
    expected = msgspec.json.decode(OLD_PAYLOADS[name], type=e.AnyEvent)
    data["added_later"] = {"nested": [1, {"deeper": None}]}
    wire = envelope(data, stream="chat", trace_id="abc", version=9)
    got = decode_envelope(wire)
    assert isinstance(got, Envelope)
    assert got.data == expected
    assert (got.stream, got.seq, got.version) == ("chat", 3, 9)
    assert got == envelope_decoder.decode(wire)


@pytest.mark.parametrize(
    "wire",
    [
        b"not json",
        b"[]",
        b'{"type": "seat_taken"}',  # no identity
        envelope({"type": "seat_taken", "seat": "zero", "player": {"name": "Ana"}}),  # known, wrong
        envelope({"type": "hand_started"}),  # known, fields missing
        envelope({"type": "seat_taken", "seat": 0, "player": {"name": "A"}}, seq="x"),
    ],
)
def test_what_is_not_an_event_is_still_refused(wire: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_envelope(wire)


def test_a_known_type_whose_data_says_another_type_is_refused() -> None:
    wire = envelope({"type": "table_expired"}, type="seat_taken")
    with pytest.raises(msgspec.ValidationError):
        decode_envelope(wire)


# --- commands, on gin.commands and inside a bot's view -------------------------------------


def queued(command: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"table_id": "t1", "source": "bot", "seat": 1, "command": command})


def test_a_queued_command_with_future_fields_is_applied_without_them() -> None:
    wire = queued({"type": "draw", "source": "stock", "command_id": "b:1", "hurry": True})
    with pytest.raises(msgspec.ValidationError):  # as a request body it is refused
        msgspec.json.decode(wire, type=QueuedCommand)
    got = decode_queued_command(msgspec.json.encode({**msgspec.json.decode(wire), "trace": 1}))
    assert got == QueuedCommand(
        table_id="t1", source="bot", seat=1, command=c.Draw(source="stock", command_id="b:1")
    )


def test_a_queued_command_of_a_future_type_is_unknown() -> None:
    got = decode_queued_command(queued({"type": "shuffle_again", "command_id": "b:2"}))
    assert got == UnknownCommand(table_id="t1", source="bot", type="shuffle_again")


@pytest.mark.parametrize(
    "wire",
    [
        b"{",
        b'{"table_id": "t1", "source": "bot"}',
        queued({"type": "draw", "source": "somewhere"}),
        queued({"type": "discard", "card": "Ks", "command_id": "bad id with spaces"}),
        msgspec.json.encode({"table_id": "t1", "source": "bot", "command": ["draw"]}),
    ],
)
def test_a_queued_command_that_is_not_one_is_refused(wire: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_queued_command(wire)


def a_bot_turn() -> dict[str, Any]:
    """A real turn of the table service (a bot to discard), as plain JSON."""
    from tests.contracts.turns import bot_turn_to_discard

    turn: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(bot_turn_to_discard()))
    return turn


def test_a_bot_turn_of_the_future_decides_as_today() -> None:
    today = a_bot_turn()
    future = msgspec.json.decode(msgspec.json.encode(today))
    future["view"]["legal"] = [
        {"type": "juggle", "cards": ["Ks"]},  # a command type added later
        *({**entry, "style": "flourish"} for entry in future["view"]["legal"]),  # a new field
        {"type": "declare_victory"},
    ]
    future["view"]["hand"]["weather"] = "sunny"
    future["priority"] = 3
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(msgspec.json.encode(future), type=BotTurn)
    got = decode_bot_turn(msgspec.json.encode(future))
    expected = msgspec.json.decode(msgspec.json.encode(today), type=BotTurn)
    assert got == expected
    for strategy in STRATEGIES.values():
        assert strategy(got.view, random.Random(1)) == strategy(expected.view, random.Random(1))


def test_a_bot_turn_with_a_bad_legal_entry_is_refused() -> None:
    turn = a_bot_turn()
    turn["view"]["legal"] = ["discard"]
    with pytest.raises(msgspec.ValidationError):
        decode_bot_turn(msgspec.json.encode(turn))


DEEP = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize("decode", [decode_envelope, decode_queued_command, decode_bot_turn])
def test_json_nested_too_deeply_is_a_decode_error(decode: Any) -> None:
    for body in (DEEP, b'{"command": ' + DEEP + b"}", b'{"data": ' + DEEP + b"}"):
        with pytest.raises(msgspec.DecodeError):
            decode(body)
