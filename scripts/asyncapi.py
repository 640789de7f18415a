#!/usr/bin/env python3
"""``make asyncapi``: the AsyncAPI 3 document of the backend's messages, from shared/contracts.

Prints ``docs/asyncapi.yaml``; the same input always gives the same bytes, and
``tests/deploy/test_contract_docs.py`` fails when the committed file differs from a fresh one.
The schemas are msgspec's own JSON Schema of the contract Structs; the channel addresses and
exchange names come from ``shared/contracts/names.py``.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec
import yaml

from shared.contracts.api import BotTurn, QueuedCommand
from shared.contracts.envelope import SCHEMA_VERSION, Envelope
from shared.contracts.events import EVENT_TYPES
from shared.contracts.names import (
    BOTS_EXCHANGE,
    COMMANDS_EXCHANGE,
    COMMANDS_QUEUE,
    DEAD_LETTER,
    EVENTS_EXCHANGE,
    HISTORY_STREAM,
    bot_key,
    chat_key,
    table_event_key,
    timer_key,
)
from shared.infra.amqp import BOT_LEVELS

SCHEMAS = "#/components/schemas/{name}"
AMQP_BINDING_VERSION = "0.3.0"
# Who publishes which event: the chat service its messages, the timer service the absence
# notice and the turn reminders (timer.<table_id>.<type>); the table service everything else.
CHAT_EVENTS = ("message_posted",)
TIMER_EVENTS = ("absence_claimable", "turn_reminder")
TABLE_EVENTS = tuple(t for t in EVENT_TYPES if t not in CHAT_EVENTS + TIMER_EVENTS)

DESCRIPTION = f"""\
The messages of selminha.com's Gin Rummy backend on RabbitMQ: the public events of every table
(the exchange `{EVENTS_EXCHANGE}`, which other services of the site may subscribe to), the bot
seats' turns (`{BOTS_EXCHANGE}`, private: only the bots' broker user reads them) and the
commands of bots and timers (the queue `{COMMANDS_QUEUE}`, which only the bots' and timers'
broker users may write).

Every event travels in an envelope (JSON): `id` (UUID), `type`, `table_id`, `stream`, `seq`,
`version` (table events: the table's version after the command), `occurred_at` (UTC, RFC 3339),
`schema_version` and `data`. Identity: `id` is unique, and `(stream, table_id, seq)` is the
event's position, never reused: each table has a `table` stream (its event log), a `chat` stream
(its messages) and a `timer` stream (the timer service's announcements), each numbered from 1
without gaps, in order within a stream (never across). Delivery is at least once: consumers
dedupe on `id` or on the position. Public events carry no hidden card until the hand-end reveal.

Compatibility: within a `schema_version`, changes are additive only (new event types, new
fields with defaults; a field's type and an enum's values never change). Consumers skip (and
acknowledge) event types they do not know and ignore fields they do not know. Every event kept
(about 7 days) is readable from the stream queue `{HISTORY_STREAM}`, from its first kept event
or from a timestamp (docs/subscribing.md).

A deployment may put a prefix before every exchange and queue name (`GIN_PREFIX`). Messages no
consumer could handle go to the dead-letter exchange and queue `{DEAD_LETTER}`. Generated from
shared/contracts by `make asyncapi`: do not edit by hand.
"""


def first_line(cls: type) -> str:
    """The first line of a class's docstring."""
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0]


def without_discriminators(schema: Any) -> Any:
    """The schema without OpenAPI's ``discriminator`` objects.

    An AsyncAPI schema's ``discriminator`` is a property name whose values are schema names,
    which ours are not; each member of a union already says its tag (``type``'s enum).
    """
    if isinstance(schema, dict):
        return {k: without_discriminators(v) for k, v in schema.items() if k != "discriminator"}
    if isinstance(schema, list):
        return [without_discriminators(v) for v in schema]
    return schema


def schemas() -> dict[str, Any]:
    """msgspec's JSON Schema of every Struct the messages carry, by name."""
    types: list[Any] = [Envelope, BotTurn, QueuedCommand, *EVENT_TYPES.values()]
    _, components = msgspec.json.schema_components(types, ref_template=SCHEMAS)
    return {name: without_discriminators(components[name]) for name in sorted(components)}


# The AMQP headers a message may carry (shared/infra/tracing.py sets them on publish).
HEADERS = {
    "type": "object",
    "properties": {
        "traceparent": {
            "type": "string",
            "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
            "description": (
                "W3C Trace Context of the work that made the message, present only while the"
                " publishing service traces (OTEL_TRACES_EXPORTER set; sampled or not): a"
                " subscriber that traces may continue it. Absent otherwise; never required."
            ),
        }
    },
}


def event_message(event_type: str) -> dict[str, Any]:
    """The message of one event type: the envelope with that ``type`` and that ``data``."""
    cls = EVENT_TYPES[event_type]
    return {
        "name": event_type,
        "title": cls.__name__,
        "summary": first_line(cls),
        "contentType": "application/json",
        "headers": HEADERS,
        "payload": {
            "allOf": [
                {"$ref": SCHEMAS.format(name="Envelope")},
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": event_type},
                        "data": {"$ref": SCHEMAS.format(name=cls.__name__)},
                    },
                },
            ]
        },
    }


def struct_message(cls: type) -> dict[str, Any]:
    """The message of a Struct sent as it is (no envelope)."""
    return {
        "name": cls.__name__,
        "title": cls.__name__,
        "summary": first_line(cls),
        "contentType": "application/json",
        "headers": HEADERS,
        "payload": {"$ref": SCHEMAS.format(name=cls.__name__)},
    }


def exchange_binding(name: str) -> dict[str, Any]:
    """The AMQP binding of a channel that is a routing key on a durable topic exchange."""
    return {
        "amqp": {
            "is": "routingKey",
            "exchange": {"name": name, "type": "topic", "durable": True, "autoDelete": False},
            "bindingVersion": AMQP_BINDING_VERSION,
        }
    }


def message_refs(names: tuple[str, ...]) -> dict[str, Any]:
    """A channel's messages, by reference to the components."""
    return {name: {"$ref": f"#/components/messages/{name}"} for name in names}


TABLE_ID = {"description": "The table's id, as in the envelope's `table_id`."}


def channels() -> dict[str, Any]:
    """Where the messages go: routing keys of the two exchanges, and the command queue."""
    return {
        "tableEvents": {
            "address": table_event_key("{table_id}", "{event_type}"),
            "title": "Table events",
            "description": (
                f"Every change of a table, on `{EVENTS_EXCHANGE}`, in `seq` order per table. "
                "A subscriber of all hand results binds `table.*.hand_ended`."
            ),
            "parameters": {
                "table_id": TABLE_ID,
                "event_type": {"enum": list(TABLE_EVENTS), "description": "The event's type."},
            },
            "messages": message_refs(TABLE_EVENTS),
            "bindings": exchange_binding(EVENTS_EXCHANGE),
        },
        "chatMessages": {
            "address": chat_key("{table_id}"),
            "title": "Chat messages",
            "description": f"A seated player's chat message, on `{EVENTS_EXCHANGE}`.",
            "parameters": {"table_id": TABLE_ID},
            "messages": message_refs(CHAT_EVENTS),
            "bindings": exchange_binding(EVENTS_EXCHANGE),
        },
        "timerEvents": {
            "address": timer_key("{table_id}", "{kind}"),
            "title": "Timer events",
            "description": (
                f"What the timer service announces, on `{EVENTS_EXCHANGE}`: the seat to act has "
                "been away past the absence time, so the other may claim the match "
                "(`absence_claimable`); and turn reminders for notifiers (`turn_reminder`): "
                "the seat to act has waited each offset of `GIN_TURN_REMINDERS_S` (default "
                "24 h and 44 h) into its turn (`reminder` `waiting`), or its absence has just "
                "become claimable (`claimable`, right after `absence_claimable`). Each once "
                "per decision, none for a turn that has moved on."
            ),
            "parameters": {
                "table_id": TABLE_ID,
                "kind": {"enum": list(TIMER_EVENTS), "description": "The event's type."},
            },
            "messages": message_refs(TIMER_EVENTS),
            "bindings": exchange_binding(EVENTS_EXCHANGE),
        },
        "botTurns": {
            "address": bot_key("{level}"),
            "title": "Bot turns",
            "description": (
                f"A bot seat must act, on `{BOTS_EXCHANGE}`: that seat's own view, never more. "
                "Each level has its durable quorum queue `gin.bots.<level>`."
            ),
            "parameters": {
                "level": {"enum": list(BOT_LEVELS), "description": "The bot's level."},
            },
            "messages": message_refs(("BotTurn",)),
            "bindings": exchange_binding(BOTS_EXCHANGE),
        },
        "commands": {
            "address": COMMANDS_QUEUE,
            "title": "Commands of bots and timers",
            "description": (
                f"The durable quorum queue `{COMMANDS_QUEUE}`, written through the direct "
                f"exchange `{COMMANDS_EXCHANGE}` (routing key: the queue's name). The table "
                "service applies each command once (its `command_id`)."
            ),
            "messages": message_refs(("QueuedCommand",)),
            "bindings": {
                "amqp": {
                    "is": "queue",
                    "queue": {
                        "name": COMMANDS_QUEUE,
                        "durable": True,
                        "exclusive": False,
                        "autoDelete": False,
                    },
                    "bindingVersion": AMQP_BINDING_VERSION,
                }
            },
        },
    }


def operation(action: str, channel: str, summary: str) -> dict[str, Any]:
    """One operation of one channel."""
    return {"action": action, "channel": {"$ref": f"#/channels/{channel}"}, "summary": summary}


def operations() -> dict[str, Any]:
    """Who sends and who receives on each channel."""
    return {
        "publishTableEvents": operation(
            "send",
            "tableEvents",
            "The table service's outbox relay, with publisher confirms, after the commit.",
        ),
        "receiveTableEvents": operation(
            "receive",
            "tableEvents",
            "The table replicas (for their WebSockets), chat, timers and the site's services.",
        ),
        "publishChatMessages": operation(
            "send", "chatMessages", "The chat service's outbox relay, after the commit."
        ),
        "receiveChatMessages": operation(
            "receive", "chatMessages", "The table replicas, for their WebSockets."
        ),
        "publishTimerEvents": operation(
            "send",
            "timerEvents",
            "The timer service, at each reminder offset and when an absence becomes claimable.",
        ),
        "receiveTimerEvents": operation(
            "receive",
            "timerEvents",
            "The table replicas, for their WebSockets, and notifiers (examples/notifier.py).",
        ),
        "publishBotTurns": operation(
            "send", "botTurns", "The table service's outbox relay, in the move's transaction."
        ),
        "receiveBotTurns": operation("receive", "botTurns", "The bot workers, one per turn."),
        "sendCommands": operation(
            "send", "commands", "Bot workers (their moves) and the timer service (expiry)."
        ),
        "receiveCommands": operation("receive", "commands", "The table service."),
    }


def document() -> dict[str, Any]:
    """The whole AsyncAPI document."""
    messages: dict[str, Any] = {t: event_message(t) for t in EVENT_TYPES}
    messages["BotTurn"] = struct_message(BotTurn)
    messages["QueuedCommand"] = struct_message(QueuedCommand)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Selminha Gin messages",
            "version": f"{SCHEMA_VERSION}.0.0",
            "description": DESCRIPTION,
        },
        "defaultContentType": "application/json",
        "servers": {
            "production": {
                "host": "gin-rabbitmq.gin.svc:5672",
                "protocol": "amqp",
                "pathname": "/gin",
                "description": "The RabbitmqCluster of deploy/k8s/overlays/prod (vhost gin).",
            },
            "local": {
                "host": "127.0.0.1:5672",
                "protocol": "amqp",
                "description": "A developer's broker (make dev).",
            },
        },
        "channels": channels(),
        "operations": operations(),
        "components": {"messages": messages, "schemas": schemas()},
    }


class _Dumper(yaml.SafeDumper):
    """Block style for text of several lines; no anchors (a shared value is written again)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(doc: dict[str, Any], header: str) -> str:
    """YAML text of a document: keys in the order built, after a comment header."""
    body: str = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return header + body


HEADER = "# Generated from shared/contracts by `make asyncapi`: do not edit.\n"


def main() -> None:
    """Print the document."""
    sys.stdout.write(render(document(), HEADER))


if __name__ == "__main__":
    main()
