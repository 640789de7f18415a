"""Exchange, queue and routing-key names (docs/DESIGN.md section 3), with the deployment prefix."""

from __future__ import annotations

EVENTS_EXCHANGE = "gin.events"
# Every event of gin.events, kept by age and size, readable from any point (docs/subscribing.md):
# a RabbitMQ stream queue bound to gin.events with "#".
HISTORY_STREAM = "gin.events.history"
BOTS_EXCHANGE = "gin.bots"
COMMANDS_QUEUE = "gin.commands"
# The direct exchange bots and timers send commands through (routing key: the queue's name), to
# gin.commands only: the default exchange would let them write any queue of the vhost.
COMMANDS_EXCHANGE = "gin.commands.in"
# Internal to the table service: each relay batch of table events as one message (a JSON array
# of their envelopes), fanned out to every replica's WebSocket hub. A replica's hub would
# otherwise get back, one message at a time, every event it has just delivered itself.
SOCKETS_EXCHANGE = "gin.sockets"


def table_event_key(table_id: str, event_type: str) -> str:
    """Routing key of a table event: ``table.<table_id>.<event_type>``."""
    return f"table.{table_id}.{event_type}"


def chat_key(table_id: str) -> str:
    """Routing key of a chat message."""
    return f"chat.{table_id}.message_posted"


def timer_key(table_id: str, kind: str) -> str:
    """Routing key of a timer event."""
    return f"timer.{table_id}.{kind}"


def bot_key(level: str) -> str:
    """Routing key of a bot turn: ``bot.<level>``."""
    return f"bot.{level}"


DEAD_LETTER = "gin.dead"
# The chat's own queue of table events (declared by the chat service).
CHAT_QUEUE = "gin.chat"
# The timers' former queue of table events (before issue 29): no longer declared; deleted with
# a run's topology, and once by the upgrade (deploy/README.md).
TIMERS_QUEUE = "gin.timers"


def bot_queue(level: str) -> str:
    """The queue of one bot level's turns."""
    return f"gin.bots.{level}"
