"""The published contracts, docs/asyncapi.yaml and docs/openapi.yaml, match the code.

Each is what its generator (scripts/asyncapi.py, scripts/openapi.py) makes now, byte for byte;
the AsyncAPI document has a message for every event type of shared/contracts and no other, on
the channels and exchanges of shared/contracts/names.py; the OpenAPI document has every route
the services register and no route that none registers. Every ``$ref`` resolves.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, get_args

import msgspec
import pytest
import yaml
from aiohttp import web

from services.table.dev_page import is_page_route
from shared.contracts import names
from shared.contracts.api import BotTurn, QueuedCommand
from shared.contracts.envelope import Envelope
from shared.contracts.events import EVENT_TYPES, BotLevel
from shared.infra.amqp import BOT_LEVELS
from shared.infra.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCRIPTS = ROOT / "scripts"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


@cache
def script(name: str) -> ModuleType:
    """A generator of scripts/, imported as the module ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def committed(name: str) -> dict[str, Any]:
    """A committed document, parsed."""
    doc: dict[str, Any] = yaml.safe_load((DOCS / name).read_text())
    return doc


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"only local references: {ref}"
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict), ref
        assert part in node, f"{ref} does not resolve"
        node = node[part]
    return node


@pytest.mark.parametrize(
    ("generator", "document"), [("asyncapi", "asyncapi.yaml"), ("openapi", "openapi.yaml")]
)
def test_committed_document_is_what_the_generator_makes(generator: str, document: str) -> None:
    module = script(generator)
    fresh = module.render(module.document(), module.HEADER)
    assert fresh == module.render(module.document(), module.HEADER), "not deterministic"
    assert (DOCS / document).read_text() == fresh, f"stale docs/{document}: run make {generator}"


@pytest.mark.parametrize("document", ["asyncapi.yaml", "openapi.yaml"])
def test_every_reference_resolves(document: str) -> None:
    doc = committed(document)
    refs = set(_refs(doc))
    assert refs
    for ref in refs:
        _resolve(doc, ref)


# --- AsyncAPI ----------------------------------------------------------------------------------


def _schema_of(cls: type) -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [cls], ref_template="#/components/schemas/{name}"
    )
    schema: dict[str, Any] = script("asyncapi").without_discriminators(components[cls.__name__])
    return schema


def test_asyncapi_has_every_event_type_and_nothing_else() -> None:
    doc = committed("asyncapi.yaml")
    assert doc["asyncapi"] == "3.0.0"
    messages = doc["components"]["messages"]
    events: dict[str, str] = {}
    for key, message in messages.items():
        if "allOf" not in message["payload"]:
            continue
        envelope, specific = message["payload"]["allOf"]
        assert envelope == {"$ref": "#/components/schemas/Envelope"}
        event_type = specific["properties"]["type"]["const"]
        assert key == message["name"] == event_type
        events[event_type] = specific["properties"]["data"]["$ref"]
    assert set(events) == set(EVENT_TYPES), "docs/asyncapi.yaml: missing or stale event types"
    for event_type, ref in events.items():
        schema = _resolve(doc, ref)
        assert schema == _schema_of(EVENT_TYPES[event_type]), f"{event_type}: not the code's"
        assert schema["properties"]["type"]["enum"] == [event_type]
    assert set(messages) - set(events) == {"BotTurn", "QueuedCommand"}
    for struct in (Envelope, BotTurn, QueuedCommand):
        assert doc["components"]["schemas"][struct.__name__] == _schema_of(struct), struct


def test_asyncapi_channels_are_the_names_of_the_contracts() -> None:
    doc = committed("asyncapi.yaml")
    channels = doc["channels"]
    on_channels: list[str] = [m for c in channels.values() for m in c["messages"]]
    assert sorted(on_channels) == sorted([*EVENT_TYPES, "BotTurn", "QueuedCommand"])
    table = channels["tableEvents"]
    assert table["address"] == names.table_event_key("{table_id}", "{event_type}")
    assert table["parameters"]["event_type"]["enum"] == list(table["messages"])
    chat = channels["chatMessages"]
    assert chat["address"] == names.chat_key("{table_id}")
    timer = channels["timerEvents"]
    assert timer["address"] == names.timer_key("{table_id}", "{kind}")
    assert timer["parameters"]["kind"]["enum"] == list(timer["messages"])
    bots = channels["botTurns"]
    assert bots["address"] == names.bot_key("{level}")
    assert bots["parameters"]["level"]["enum"] == list(BOT_LEVELS)
    assert set(BOT_LEVELS) == set(get_args(BotLevel))
    exchanges = {
        name: c["bindings"]["amqp"]["exchange"]["name"]
        for name, c in channels.items()
        if c["bindings"]["amqp"]["is"] == "routingKey"
    }
    assert exchanges == {
        "tableEvents": names.EVENTS_EXCHANGE,
        "chatMessages": names.EVENTS_EXCHANGE,
        "timerEvents": names.EVENTS_EXCHANGE,
        "botTurns": names.BOTS_EXCHANGE,
    }
    assert channels["commands"]["address"] == names.COMMANDS_QUEUE
    assert channels["commands"]["bindings"]["amqp"]["queue"]["name"] == names.COMMANDS_QUEUE
    for operation in doc["operations"].values():
        _resolve(doc, operation["channel"]["$ref"])


# --- OpenAPI -----------------------------------------------------------------------------------


def _table_app() -> web.Application:
    from services.table.app import create_app

    return create_app(Settings(dev_tokens=True))


def _chat_app() -> web.Application:
    from services.chat.app import create_app

    return create_app(Settings())


def _timers_app() -> web.Application:
    from services.timers.app import create_app

    return create_app(Settings())


def _bots_app() -> web.Application:
    from services.bots.app import create_app

    return create_app(Settings())


# Each service's app (built, never started: building opens nothing) and the tags of its routes.
APPS: dict[str, tuple[Callable[[], web.Application], set[str]]] = {
    "table": (_table_app, {"table", "ops"}),
    "chat": (_chat_app, {"chat", "ops"}),
    "timers": (_timers_app, {"ops"}),
    "bots": (_bots_app, {"ops"}),
}


def registered(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route of an app (aiohttp adds HEAD to GET by itself)."""
    routes = set()
    for route in app.router.routes():
        # The development page (web/, served with development tokens on) is no API route.
        if route.method == "HEAD" or is_page_route(route):
            continue
        routes.add((route.method.lower(), route.resource.canonical))  # type: ignore[union-attr]
    return routes


def documented(tags: set[str]) -> set[tuple[str, str]]:
    """(method, path) of every operation of docs/openapi.yaml with one of these tags."""
    found = set()
    for path, item in committed("openapi.yaml")["paths"].items():
        for method, operation in item.items():
            if method in METHODS and set(operation["tags"]) & tags:
                found.add((method, path))
    return found


@pytest.mark.parametrize("service", list(APPS))
def test_openapi_has_every_route_and_nothing_stale(service: str) -> None:
    build, tags = APPS[service]
    routes = registered(build())
    assert routes
    assert routes == documented(tags), (
        f"{service}: registered, not documented: {sorted(routes - documented(tags))}; "
        f"documented, not registered: {sorted(documented(tags) - routes)}"
    )


def test_openapi_documents_no_route_that_no_service_serves() -> None:
    served = set().union(*(registered(build()) for build, _ in APPS.values()))
    assert documented({"table", "chat", "ops"}) == served
    doc = committed("openapi.yaml")
    assert doc["openapi"] == "3.1.0"
    operation_ids = [
        op["operationId"]
        for item in doc["paths"].values()
        for method, op in item.items()
        if method in METHODS
    ]
    assert len(operation_ids) == len(set(operation_ids))
