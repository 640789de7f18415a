"""Contract tests of ``shared/contracts``: the wire format every service and client relies on.

Every command and event round-trips through msgspec JSON, alone and inside the envelope
(docs/DESIGN.md section 3); tags are unique; every event type the design names exists; payloads
written by an older producer still decode, and an unknown extra field in an event is tolerated;
commands and table options refuse what they must (docs/RULES.md R9.5).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.contracts import commands as c
from shared.contracts import events as e
from shared.contracts.envelope import SCHEMA_VERSION, Envelope, envelope_decoder, wrap
from shared.contracts.options import StrictTableOptions, TableOptions

COMMAND_TYPES: list[type[msgspec.Struct]] = list(c.AnyCommand.__args__)
EVENT_TYPES: list[type[msgspec.Struct]] = list(e.AnyEvent.__args__)

# docs/DESIGN.md section 3: "The event types cover the whole game: ..."
DESIGN_EVENT_TYPES = [
    "table_created",
    "seat_taken",
    "match_started",
    "hand_started",
    "upcard_taken",
    "upcard_passed",
    "card_drawn",
    "card_discarded",
    "stock_low",
    "hand_ended",
    "match_ended",
    "rematch_offered",
    "rematch_accepted",
    "absence_claimable",
    "turn_reminder",
    "table_expired",
    "table_closed",
    "player_erased",
    "message_posted",
]
# docs/DESIGN.md section 7: "Command types: ..."
DESIGN_COMMAND_TYPES = [
    "take_upcard",
    "pass_upcard",
    "draw",
    "discard",
    "knock",
    "big_gin",
    "resign",
    "leave",
    "claim_absence",
    "rematch",
    "decline_rematch",
]


def tag(cls: type[msgspec.Struct]) -> str:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    assert isinstance(info.tag, str), f"{cls.__name__} has no string tag"
    return info.tag


# --- values of any contract type, built from msgspec's own description of it ----------------

SAFE_INT = 2**53  # JSON numbers every client can read exactly
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)


def strategy_for(info: mi.Type) -> st.SearchStrategy[Any]:
    """Valid values of a msgspec type: every constraint (ge, lengths, literals) respected."""
    if isinstance(info, mi.IntType):
        low = -SAFE_INT
        high = SAFE_INT
        if info.ge is not None:
            low = max(low, info.ge)
        if info.gt is not None:
            low = max(low, info.gt + 1)
        if info.le is not None:
            high = min(high, info.le)
        if info.lt is not None:
            high = min(high, info.lt - 1)
        return st.integers(low, high)
    if isinstance(info, mi.StrType):
        if info.pattern is not None:
            return st.from_regex(info.pattern, fullmatch=True)
        return st.text(
            st.characters(exclude_categories=("Cs",)),
            min_size=info.min_length or 0,
            max_size=info.max_length if info.max_length is not None else 20,
        )
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.FloatType):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(info.values)
    if isinstance(info, mi.UnionType):
        return st.one_of([strategy_for(t) for t in info.types])
    if isinstance(info, mi.ListType):
        return st.lists(
            strategy_for(info.item_type),
            min_size=info.min_length or 0,
            max_size=info.max_length if info.max_length is not None else 4,
        )
    if isinstance(info, mi.UUIDType):
        return st.uuids()
    if isinstance(info, mi.DateTimeType):
        return st.datetimes(timezones=st.just(UTC))
    if isinstance(info, mi.StructType):
        return struct_strategy(info)
    raise NotImplementedError(f"no strategy for {info!r}: extend strategy_for")


def _build(cls: type[Any], kwargs: dict[str, Any]) -> Any:
    try:
        return cls(**kwargs)
    except ValueError:  # a cross-field check in __post_init__ (TableOptions)
        return None


def struct_strategy(info: mi.StructType) -> st.SearchStrategy[Any]:
    required = {f.name: strategy_for(f.type) for f in info.fields if f.required}
    optional = {f.name: strategy_for(f.type) for f in info.fields if not f.required}
    kwargs = st.fixed_dictionaries(required, optional=optional)
    return kwargs.map(lambda kw: _build(info.cls, kw)).filter(lambda v: v is not None)


def values_of(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return struct_strategy(info)


CONTRACTS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", COMMAND_TYPES, ids=lambda cls: cls.__name__)
@CONTRACTS
@given(data=st.data())
def test_every_command_round_trips(cls: type[msgspec.Struct], data: st.DataObject) -> None:
    command = data.draw(values_of(cls))
    wire = msgspec.json.encode(command)
    assert msgspec.json.decode(wire)["type"] == tag(cls)
    assert c.command_decoder.decode(wire) == command
    assert msgspec.json.decode(wire, type=cls) == command


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.__name__)
@CONTRACTS
@given(data=st.data())
def test_every_event_round_trips(cls: type[msgspec.Struct], data: st.DataObject) -> None:
    event = data.draw(values_of(cls))
    wire = msgspec.json.encode(event)
    assert msgspec.json.decode(wire)["type"] == tag(cls)
    assert msgspec.json.decode(wire, type=e.AnyEvent) == event
    assert msgspec.json.decode(wire, type=cls) == event


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.__name__)
@CONTRACTS
@given(
    data=st.data(),
    table_id=TEXT,
    seq=st.integers(0, SAFE_INT),
    when=st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-3))])),
)
def test_every_event_round_trips_in_its_envelope(
    cls: type[msgspec.Struct], data: st.DataObject, table_id: str, seq: int, when: datetime
) -> None:
    event = data.draw(values_of(cls))
    envelope = wrap(table_id, seq, event, when)
    assert envelope.type == tag(cls)
    assert envelope.schema_version == SCHEMA_VERSION
    assert envelope.occurred_at == when
    assert envelope.occurred_at.utcoffset() == timedelta(0)  # UTC on the wire
    wire = msgspec.json.encode(envelope)
    raw = msgspec.json.decode(wire)
    assert set(raw) == {
        "id",
        "type",
        "table_id",
        "stream",
        "seq",
        "version",
        "occurred_at",
        "schema_version",
        "data",
    }
    assert raw["stream"] == "table"
    assert raw["type"] == raw["data"]["type"] == tag(cls)
    assert raw["occurred_at"].endswith("Z")  # RFC 3339, UTC
    uuid.UUID(raw["id"])
    decoded = envelope_decoder.decode(wire)
    assert decoded == envelope
    assert decoded.data == event


def test_envelopes_get_fresh_ids() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    event = e.TableExpired()
    assert wrap("t", 1, event, when).id != wrap("t", 1, event, when).id


# --- tags and names -------------------------------------------------------------------------


def test_command_tags_are_unique_and_cover_the_design() -> None:
    tags = [tag(cls) for cls in COMMAND_TYPES]
    assert len(tags) == len(set(tags))
    assert set(DESIGN_COMMAND_TYPES) <= set(tags)
    assert {tag(cls) for cls in c.PLAYER_COMMANDS} == set(DESIGN_COMMAND_TYPES)


def test_event_tags_are_unique_and_cover_the_design() -> None:
    tags = [tag(cls) for cls in EVENT_TYPES]
    assert len(tags) == len(set(tags))
    assert set(DESIGN_EVENT_TYPES) <= set(tags)
    assert set(e.EVENT_TYPES) == set(tags)
    assert all(tag(cls) == name for name, cls in e.EVENT_TYPES.items())


@pytest.mark.parametrize("name", DESIGN_EVENT_TYPES)
def test_every_design_event_type_exists(name: str) -> None:
    assert name in e.EVENT_TYPES
    # a payload carrying only the tag is recognised as that type (and refused only for its
    # missing fields, never as an unknown type)
    wire = msgspec.json.encode({"type": name})
    info = mi.type_info(e.EVENT_TYPES[name])
    assert isinstance(info, mi.StructType)
    if any(field.required for field in info.fields):
        with pytest.raises(msgspec.ValidationError, match="Object missing required field"):
            msgspec.json.decode(wire, type=e.AnyEvent)
    else:
        assert tag(type(msgspec.json.decode(wire, type=e.AnyEvent))) == name


def test_an_unknown_event_type_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'card_eaten'"):
        msgspec.json.decode(b'{"type": "card_eaten", "hand": 1}', type=e.AnyEvent)


# --- old payloads still decode --------------------------------------------------------------

# Payloads as the first version of the contract wrote them: only the fields every version has
# (fields added later carry defaults). If a change makes one of these fail, it broke old events.
OLD_PAYLOADS: dict[str, bytes] = {
    "table_created": b'{"type":"table_created","options":{},"creator":{"name":"Ana"}}',
    "seat_taken": b'{"type":"seat_taken","seat":1,"player":{"name":"TITO","bot":"tito"}}',
    "match_started": b'{"type":"match_started","match":1,"options":{"target":100}}',
    "hand_started": (
        b'{"type":"hand_started","match":1,"hand":1,"dealer":0,"reason":"lot",'
        b'"upcard":"7h","stock_count":31,"knock_limit":10,"deck_commitment":"ab12"}'
    ),
    "upcard_taken": b'{"type":"upcard_taken","hand":1,"seat":1,"card":"7h"}',
    "upcard_passed": b'{"type":"upcard_passed","hand":1,"seat":1}',
    "card_drawn": b'{"type":"card_drawn","hand":1,"seat":0,"source":"stock","stock_count":30}',
    "card_discarded": b'{"type":"card_discarded","hand":1,"seat":0,"card":"Ks"}',
    "stock_low": b'{"type":"stock_low","hand":1,"stock_count":4}',
    "hand_ended": (
        b'{"type":"hand_ended","match":1,"hand":2,"how":"dead_hand","winner":null,"points":0,'
        b'"seats":[{"seat":0,"cards":["Ac"],"melds":[],"deadwood":["Ac"],"points":1}],'
        b'"layoffs":[],"scores":[0,0],"hands_won":[0,0],"deck":["Ac","2c"],"salt":"s"}'
    ),
    "match_ended": (
        b'{"type":"match_ended","match":1,"winner":0,"reason":"target","tally":['
        b'{"points":104,"hands_won":3,"game_bonus":100,"box_bonus":75,"total":279},'
        b'{"points":20,"hands_won":1,"game_bonus":0,"box_bonus":25,"total":45}]}'
    ),
    "rematch_offered": b'{"type":"rematch_offered","match":1,"seat":0}',
    "rematch_accepted": b'{"type":"rematch_accepted","match":2}',
    "absence_claimable": b'{"type":"absence_claimable","seat":1,"since":"2026-01-01T00:00:00Z"}',
    "turn_reminder": (
        b'{"type":"turn_reminder","seat":1,"since":"2026-01-01T00:00:00Z","waited_s":86400.2,'
        b'"claimable_at":"2026-01-03T00:00:00Z","reminder":"waiting","after_s":86400.0}'
    ),
    "table_expired": b'{"type":"table_expired"}',
    "table_closed": b'{"type":"table_closed","reason":"rematch_declined"}',
    "message_posted": b'{"type":"message_posted","message_id":7,"seat":0,"name":"Ana","text":"oi"}',
    "player_erased": (
        b'{"type":"player_erased","seat":0,"player":{"name":"Jogador removido","id":"erased-1"}}'
    ),
}


def test_there_is_an_old_payload_for_every_event_type() -> None:
    assert set(OLD_PAYLOADS) == set(e.EVENT_TYPES)


@pytest.mark.parametrize("name", sorted(OLD_PAYLOADS))
def test_old_payloads_still_decode(name: str) -> None:
    wire = OLD_PAYLOADS[name]
    event = msgspec.json.decode(wire, type=e.AnyEvent)
    assert type(event) is e.EVENT_TYPES[name]
    # every field the old payload had comes back as written
    raw = msgspec.json.decode(wire)
    again = msgspec.to_builtins(event)
    for key, value in raw.items():
        if key in ("options", "creator", "player"):
            continue  # nested structs gain their defaults
        assert again[key] == value, key


def test_old_payload_defaults() -> None:
    """Fields added after the first version read as their documented defaults."""
    ended = msgspec.json.decode(OLD_PAYLOADS["hand_ended"], type=e.HandEnded)
    assert ended.knocker is None
    assert ended.knock_discard is None
    assert ended.knock_discard_chosen_by_server is False
    assert msgspec.json.decode(OLD_PAYLOADS["card_drawn"], type=e.CardDrawn).card is None
    assert msgspec.json.decode(OLD_PAYLOADS["upcard_passed"], type=e.UpcardPassed).reason is None
    assert msgspec.json.decode(OLD_PAYLOADS["match_ended"], type=e.MatchEnded).by is None
    started = msgspec.json.decode(OLD_PAYLOADS["match_started"], type=e.MatchStarted)
    assert started.options == TableOptions()


def test_old_envelope_without_schema_version_decodes() -> None:
    wire = (
        b'{"id":"6f1c2a4e-0d5b-4c3e-9a7f-2b8d1e0c9a55","type":"card_discarded","table_id":"t1",'
        b'"seq":12,"occurred_at":"2026-01-02T03:04:05Z",'
        b'"data":{"type":"card_discarded","hand":1,"seat":0,"card":"Ks"}}'
    )
    envelope = envelope_decoder.decode(wire)
    assert envelope.schema_version == 1
    assert envelope.data == e.CardDiscarded(hand=1, seat=0, card="Ks")
    assert envelope.occurred_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize("name", sorted(OLD_PAYLOADS))
def test_unknown_extra_fields_in_events_are_tolerated(name: str) -> None:
    raw = msgspec.json.decode(OLD_PAYLOADS[name])
    expected = msgspec.json.decode(OLD_PAYLOADS[name], type=e.AnyEvent)
    raw["added_in_a_later_version"] = {"nested": [1, 2, 3]}
    decoded = msgspec.json.decode(msgspec.json.encode(raw), type=e.AnyEvent)
    assert decoded == expected
    envelope = {
        "id": "6f1c2a4e-0d5b-4c3e-9a7f-2b8d1e0c9a55",
        "type": name,
        "table_id": "t1",
        "seq": 3,
        "occurred_at": "2026-01-02T03:04:05Z",
        "schema_version": 1,
        "trace": "an envelope field added later",
        "data": raw,
    }
    assert envelope_decoder.decode(msgspec.json.encode(envelope)).data == expected


@pytest.mark.parametrize("name", ["table_created", "match_started"])
def test_unknown_option_inside_an_event_is_tolerated(name: str) -> None:
    raw = msgspec.json.decode(OLD_PAYLOADS[name])
    raw["options"]["an_option_added_later"] = True
    expected = msgspec.json.decode(OLD_PAYLOADS[name], type=e.AnyEvent)
    assert msgspec.json.decode(msgspec.json.encode(raw), type=e.AnyEvent) == expected


# --- commands refuse what they must ---------------------------------------------------------


def test_commands_decode_from_literal_json() -> None:
    decode = c.command_decoder.decode
    assert decode(b'{"type":"take_upcard"}') == c.TakeUpcard()
    assert decode(b'{"type":"draw","source":"discard"}') == c.Draw(source="discard")
    assert decode(b'{"type":"discard","card":"10h","command_id":"x1","expected_version":4}') == (
        c.Discard(card="10h", command_id="x1", expected_version=4)
    )
    assert decode(b'{"type":"knock","card":"Ks","melds":[["Ah","2h","3h"]]}') == c.Knock(
        card="Ks", melds=[["Ah", "2h", "3h"]]
    )
    assert decode(b'{"type":"knock"}') == c.Knock()
    # omit_defaults: a command body carries only what was set
    assert msgspec.json.decode(msgspec.json.encode(c.Knock(card="Ks"))) == {
        "type": "knock",
        "card": "Ks",
    }


BAD_COMMANDS = {
    "unknown field": b'{"type":"discard","card":"Ah","colour":"red"}',
    "unknown field on an empty command": b'{"type":"pass_upcard","please":true}',
    "unknown type": b'{"type":"shuffle"}',
    "no type": b'{"card":"Ah"}',
    "missing field": b'{"type":"discard"}',
    "card not a string": b'{"type":"discard","card":7}',
    "empty card": b'{"type":"discard","card":""}',
    "card too long": b'{"type":"discard","card":"Ahhhh"}',
    "bad source": b'{"type":"draw","source":"hand"}',
    "source not a string": b'{"type":"draw","source":1}',
    "negative version": b'{"type":"resign","expected_version":-1}',
    "version not an int": b'{"type":"resign","expected_version":"3"}',
    "version a float": b'{"type":"resign","expected_version":1.5}',
    "empty command id": b'{"type":"leave","command_id":""}',
    "command id too long": b'{"type":"leave","command_id":"' + b"x" * 101 + b'"}',
    "melds not lists": b'{"type":"knock","melds":["Ah 2h 3h"]}',
    "meld card not a string": b'{"type":"knock","melds":[[1,2,3]]}',
    "deadwood not an int": b'{"type":"knock","card":"Ks","deadwood":"4"}',
    "not an object": b'["discard","Ah"]',
}


@pytest.mark.parametrize("wire", BAD_COMMANDS.values(), ids=BAD_COMMANDS.keys())
def test_commands_refuse_unknown_fields_and_bad_types(wire: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        c.command_decoder.decode(wire)


@pytest.mark.parametrize("cls", COMMAND_TYPES, ids=lambda cls: cls.__name__)
def test_every_command_refuses_an_unknown_field(cls: type[msgspec.Struct]) -> None:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    assert info.forbid_unknown_fields
    body = {"type": tag(cls), "surprise": 1}
    for field in info.fields:
        if field.required:
            body[field.name] = {"source": "stock", "card": "Ah"}[field.name]
    with pytest.raises(msgspec.ValidationError, match="unknown field `surprise`"):
        c.command_decoder.decode(msgspec.json.encode(body))
    del body["surprise"]
    assert type(c.command_decoder.decode(msgspec.json.encode(body))) is cls


# --- table options (R9.5) -------------------------------------------------------------------

BONUSES = ["gin_bonus", "big_gin_bonus", "undercut_bonus", "box_bonus", "game_bonus"]
BONUSES.append("shutout_bonus")


def decode_options(fields: dict[str, Any]) -> TableOptions:
    """Options as a create-table request sends them (strict: unknown options refused)."""
    return msgspec.json.decode(msgspec.json.encode(fields), type=StrictTableOptions).plain()


def test_default_options_are_selminhas() -> None:
    assert decode_options({}) == TableOptions(
        target=100,
        gin_bonus=25,
        big_gin_bonus=31,
        big_gin=True,
        undercut_bonus=25,
        box_bonus=25,
        game_bonus=100,
        shutout_bonus=200,
        dealer="winner",
        straight_gin=False,
        oklahoma=False,
    )


@pytest.mark.parametrize("name", BONUSES)
def test_options_refuse_negative_bonuses(name: str) -> None:
    assert getattr(decode_options({name: 0}), name) == 0
    with pytest.raises(msgspec.ValidationError, match=name):
        decode_options({name: -1})


@pytest.mark.parametrize("target", [0, -1, -100])
def test_options_refuse_a_target_below_one(target: int) -> None:
    with pytest.raises(msgspec.ValidationError, match="target"):
        decode_options({"target": target})
    assert decode_options({"target": 1}).target == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"target": "100"},
        {"target": 10.5},
        {"big_gin": "yes"},
        {"dealer": "random"},
        {"straight_gin": True, "oklahoma": True},
        {"target": 10_001},
    ],
    ids=str,
)
def test_options_refuse_bad_values(fields: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_options(fields)
    with pytest.raises(msgspec.ValidationError):  # also as events and stored state carry them
        msgspec.json.decode(msgspec.json.encode(fields), type=TableOptions)


@pytest.mark.parametrize(
    "fields",
    [{"target": 0}, {"target": -5}, *({name: -1} for name in BONUSES)],
    ids=str,
)
def test_options_built_in_code_refuse_bad_values_too(fields: dict[str, Any]) -> None:
    """R9.5: a bad value is refused however the options are made, not only when decoded."""
    with pytest.raises(ValueError, match=next(iter(fields))):
        TableOptions(**fields)


def test_a_request_refuses_an_unknown_option() -> None:
    """A request's options (StrictTableOptions) refuse an option the server does not know."""
    wire = b'{"target": 50, "doubling": true}'
    with pytest.raises(msgspec.ValidationError, match="unknown field `doubling`"):
        msgspec.json.decode(wire, type=StrictTableOptions)
    assert msgspec.json.decode(wire, type=TableOptions) == TableOptions(target=50)
    strict = msgspec.json.decode(b'{"target": 50}', type=StrictTableOptions)
    assert strict.plain() == TableOptions(target=50)
    assert type(strict.plain()) is TableOptions


def test_options_refused_inside_a_table_created_event() -> None:
    wire = b'{"type":"table_created","options":{"gin_bonus":-5},"creator":{"name":"Ana"}}'
    with pytest.raises(msgspec.ValidationError, match="gin_bonus"):
        msgspec.json.decode(wire, type=e.AnyEvent)


def test_envelope_is_a_struct_with_the_design_fields() -> None:
    info = mi.type_info(Envelope)
    assert isinstance(info, mi.StructType)
    names = [f.name for f in info.fields]
    assert names == [
        "id",
        "type",
        "table_id",
        "stream",
        "seq",
        "version",
        "occurred_at",
        "schema_version",
        "data",
    ]
