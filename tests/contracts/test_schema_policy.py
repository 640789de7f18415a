"""The compatibility policy, enforced: the contracts' schema against the one kept in the
repository (docs/contracts/v<schema_version>.json, written by ``make contracts-schema``).

Within a schema version only additive changes pass; each kind of break is caught.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shared.contracts.envelope import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    name = "contracts_schema"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


schema = _script()


def kept() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(schema.path_of(SCHEMA_VERSION).read_text())
    return doc


def test_the_kept_schema_is_the_codes() -> None:
    text = schema.path_of(SCHEMA_VERSION).read_text()
    assert text == schema.render(schema.document()), (
        "docs/contracts: the contracts changed; run make contracts-schema (it refuses a change "
        "that is not additive)"
    )


def test_the_code_keeps_the_policy_against_the_kept_schema() -> None:
    assert schema.breaks(kept(), schema.document()) == []


def test_every_message_and_event_is_in_the_schema() -> None:
    from shared.contracts.events import EVENT_TYPES

    doc = kept()
    assert set(doc["messages"]) == {"Envelope", "BotTurn", "QueuedCommand"}
    assert {cls.__name__ for cls in EVENT_TYPES.values()} <= set(doc["components"])


# --- the checker catches each kind of break, and lets additive changes through -------------


def changed(edit: Any) -> list[str]:
    new = copy.deepcopy(kept())
    edit(new["components"])
    found: list[str] = schema.breaks(kept(), new)
    return found


def _drop_field(c: dict[str, Any]) -> None:
    del c["SeatTaken"]["properties"]["seat"]
    c["SeatTaken"]["required"].remove("seat")


def _retype_field(c: dict[str, Any]) -> None:
    c["HandStarted"]["properties"]["stock_count"] = {"type": "string"}


def _required_new_field(c: dict[str, Any]) -> None:
    c["CardDiscarded"]["properties"]["face"] = {"type": "string"}
    c["CardDiscarded"]["required"].append("face")


def _narrow_enum(c: dict[str, Any]) -> None:
    how = c["HandEnded"]["properties"]["how"]
    how["enum"] = [v for v in how["enum"] if v != "undercut"]


def _widen_enum(c: dict[str, Any]) -> None:
    c["MatchEnded"]["properties"]["reason"]["enum"].append("boredom")


def _drop_event_type(c: dict[str, Any]) -> None:
    data = c["Envelope"]["properties"]["data"]
    data["anyOf"] = [m for m in data["anyOf"] if m["$ref"] != "#/components/StockLow"]
    del data["discriminator"]["mapping"]["stock_low"]


def _drop_command_type(c: dict[str, Any]) -> None:
    legal = c["TableView"]["properties"]["legal"]["items"]
    legal["anyOf"] = [m for m in legal["anyOf"] if m["$ref"] != "#/components/BigGin"]


def _optional_becomes_required(c: dict[str, Any]) -> None:
    c["CardDrawn"]["required"].append("card")


def _bound_tightened(c: dict[str, Any]) -> None:
    target = c["TableOptions"]["properties"]["target"]
    target["maximum"] = 500


def _remove_struct(c: dict[str, Any]) -> None:
    del c["SeatTally"]


def _nullable_loses_null(c: dict[str, Any]) -> None:
    c["MatchEnded"]["properties"]["winner"] = {"type": "integer"}


BREAKS = {
    "a field removed": (_drop_field, "SeatTaken.seat: removed"),
    "a field's type changed": (_retype_field, "HandStarted.stock_count"),
    "a new required field": (_required_new_field, "CardDiscarded.face: a new field must"),
    "an enum narrowed": (_narrow_enum, "HandEnded.how"),
    "an enum widened": (_widen_enum, "MatchEnded.reason"),
    "an event type removed": (_drop_event_type, "StockLow removed"),
    "a command type removed": (_drop_command_type, "BigGin removed"),
    "an optional field made required": (_optional_becomes_required, "CardDrawn.card: was"),
    "a bound tightened": (_bound_tightened, "TableOptions.target"),
    "a struct removed": (_remove_struct, "components.SeatTally: removed"),
    "a nullable field made non-null": (_nullable_loses_null, "MatchEnded.winner"),
}


@pytest.mark.parametrize("case", list(BREAKS))
def test_a_break_is_caught(case: str) -> None:
    edit, expected = BREAKS[case]
    found = changed(edit)
    assert found, f"{case}: not caught"
    assert any(expected in line for line in found), found


def _new_optional_field(c: dict[str, Any]) -> None:
    c["CardDiscarded"]["properties"]["face"] = {"type": "string", "default": "up"}


def _new_event_type(c: dict[str, Any]) -> None:
    c["CardJuggled"] = {
        "type": "object",
        "properties": {"type": {"enum": ["card_juggled"]}, "hand": {"type": "integer"}},
        "required": ["type", "hand"],
    }
    data = c["Envelope"]["properties"]["data"]
    data["anyOf"].append({"$ref": "#/components/CardJuggled"})
    data["discriminator"]["mapping"]["card_juggled"] = "#/components/CardJuggled"


def _new_command_type(c: dict[str, Any]) -> None:
    legal = c["TableView"]["properties"]["legal"]["items"]
    legal["anyOf"].append({"$ref": "#/components/Juggle"})
    c["Juggle"] = {"type": "object", "properties": {}, "required": []}


def _docs_rewritten(c: dict[str, Any]) -> None:
    c["SeatTaken"]["description"] = "Someone sat down."


ADDITIVE = {
    "a new optional field": _new_optional_field,
    "a new event type": _new_event_type,
    "a new command type": _new_command_type,
    "documentation rewritten": _docs_rewritten,
}


@pytest.mark.parametrize("case", list(ADDITIVE))
def test_an_additive_change_passes(case: str) -> None:
    assert changed(ADDITIVE[case]) == []


def test_the_target_refuses_to_write_a_break(tmp_path: Path, monkeypatch: Any) -> None:
    good = kept()
    broken = copy.deepcopy(good)
    broken["components"]["SeatTaken"]["properties"]["seat"] = {"type": "string"}
    monkeypatch.setattr(schema, "DIR", tmp_path)
    path = schema.path_of(SCHEMA_VERSION)
    path.write_text(json.dumps(broken))
    assert schema.main() == 1
    assert json.loads(path.read_text()) == broken  # untouched
    path.write_text(json.dumps(good))
    assert schema.main() == 0
    assert path.read_text() == schema.render(schema.document())
