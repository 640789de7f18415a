#!/usr/bin/env python3
"""``make contracts-schema``: the JSON Schema of the message contracts, kept per schema version.

``docs/contracts/v<N>.json`` is the schema of every message on the broker (the envelope with
every event, bot turns, queued commands) as ``shared/contracts`` makes it. The policy
(docs/subscribing.md): within one ``schema_version`` changes are additive. ``breaks(old, new)``
lists what a change breaks; tests/contracts/test_schema_policy.py fails on any, and on a
schema file that is not the code's. This target rewrites the current version's file only when
the change is additive (else it prints the breaks and exits 1: raise ``SCHEMA_VERSION`` and
publish the new version beside the old).

Additive means: no message, struct or field is removed; a field keeps its schema exactly (type,
format, bounds, pattern, enum values); a new field is optional (has a default); a field does
not become required or optional; a tagged union (the event types, the command types) only
gains members.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from shared.contracts.api import BotTurn, QueuedCommand
from shared.contracts.envelope import SCHEMA_VERSION, Envelope

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / "docs" / "contracts"
MESSAGES: dict[str, type] = {
    "Envelope": Envelope,
    "BotTurn": BotTurn,
    "QueuedCommand": QueuedCommand,
}
DOC_KEYS = {"title", "description", "examples"}


def path_of(version: int = SCHEMA_VERSION) -> Path:
    """The schema file of one schema version."""
    return DIR / f"v{version}.json"


def document() -> dict[str, Any]:
    """The schema of every broker message, as the code makes it now."""
    schemas, components = msgspec.json.schema_components(
        list(MESSAGES.values()), ref_template="#/components/{name}"
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "messages": dict(zip(MESSAGES, schemas, strict=True)),
        "components": components,
    }


def render(doc: dict[str, Any]) -> str:
    """The file's text: stable, sorted, one key a line."""
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _plain(schema: Any) -> Any:
    """A schema without its documentation (docstrings may change freely)."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k not in DOC_KEYS}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def _is_tagged_union(schema: dict[str, Any]) -> bool:
    members = schema.get("anyOf") or schema.get("oneOf")
    return isinstance(members, list) and all(set(m) == {"$ref"} for m in members)


def _compare(old: Any, new: Any, where: str, out: list[str]) -> None:
    if not (isinstance(old, dict) and isinstance(new, dict)):
        if old != new:
            out.append(f"{where}: was {json.dumps(old)}, now {json.dumps(new)}")
        return
    if "properties" in old:
        if "properties" not in new:
            out.append(f"{where}: no longer an object with fields")
            return
        old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
        for name, field in old["properties"].items():
            if name not in new["properties"]:
                out.append(f"{where}.{name}: removed")
                continue
            _compare(field, new["properties"][name], f"{where}.{name}", out)
            if (name in old_required) != (name in new_required):
                was = "required" if name in old_required else "optional"
                out.append(f"{where}.{name}: was {was}, is no longer")
        for name in sorted(new_required - set(old["properties"])):
            out.append(f"{where}.{name}: a new field must have a default (not be required)")
        rest_old = {k: v for k, v in old.items() if k not in ("properties", "required")}
        rest_new = {k: v for k, v in new.items() if k not in ("properties", "required")}
        _compare_keys(rest_old, rest_new, where, out)
        return
    if _is_tagged_union(old) and _is_tagged_union(new):
        key_old = "anyOf" if "anyOf" in old else "oneOf"
        key_new = "anyOf" if "anyOf" in new else "oneOf"
        for member in old[key_old]:
            if member not in new[key_new]:
                out.append(f"{where}: union member {member['$ref']} removed")
        mapping_old = old.get("discriminator", {}).get("mapping", {})
        mapping_new = new.get("discriminator", {}).get("mapping", {})
        for tag, ref in mapping_old.items():
            if mapping_new.get(tag) != ref:
                out.append(f"{where}: tag {tag!r} no longer means {ref}")
        return
    _compare_keys(old, new, where, out)


def _compare_keys(old: dict[str, Any], new: dict[str, Any], where: str, out: list[str]) -> None:
    for key in sorted(set(old) | set(new)):
        if key not in new:
            out.append(f"{where}: {key} {json.dumps(old[key])} removed")
        elif key not in old:
            out.append(f"{where}: {key} {json.dumps(new[key])} added")
        else:
            _compare(old[key], new[key], f"{where}/{key}", out)


def breaks(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What in ``new`` breaks a consumer written against ``old`` (same schema version)."""
    old, new = _plain(old), _plain(new)
    out: list[str] = []
    for section in ("messages", "components"):
        for name, schema in old[section].items():
            if name not in new[section]:
                out.append(f"{section}.{name}: removed")
            else:
                _compare(schema, new[section][name], f"{section}.{name}", out)
    return out


def main() -> int:
    """Write the current version's schema file, unless the change breaks the policy."""
    fresh = document()
    path = path_of()
    if path.exists():
        found = breaks(json.loads(path.read_text()), fresh)
        if found:
            sys.stderr.write(
                f"{path}: this change is not additive; raise SCHEMA_VERSION "
                "or make it additive:\n" + "".join(f"  {line}\n" for line in found)
            )
            return 1
    DIR.mkdir(parents=True, exist_ok=True)
    path.write_text(render(fresh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
