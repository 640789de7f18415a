"""The envelope every published event travels in (docs/DESIGN.md section 3).

Identity, the same for every event on ``gin.events``:

- ``id`` is unique: one event has one id, and a republished event (at least once) keeps it.
- ``(stream, table_id, seq)`` is the event's position, never reused. Each table has three
  streams, each numbered from 1 without gaps and in the order its events happened:
  ``table`` (the table's event log: ``seq`` as in ``GET /v1/tables/{id}/events``),
  ``chat`` (the table's chat messages: ``seq`` is ``message_id``) and ``timer`` (what the timer
  service announced about the table). Order holds within one stream, never across streams.
- A consumer dedupes on ``id`` or on the position; both say the same.

Compatibility (docs/subscribing.md): within one ``schema_version`` changes are additive
(new event types, new fields with defaults); consumers skip unknown types and ignore unknown
fields (``shared.contracts.compat``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Literal

import msgspec

from shared.contracts.events import AnyEvent

SCHEMA_VERSION = 1
Stream = Literal["table", "chat", "timer"]
STREAMS: tuple[Stream, ...] = ("table", "chat", "timer")


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """One event: ``id`` unique, ``(stream, table_id, seq)`` its position, never reused.

    ``stream`` is absent from events published before it existed: those are ``table``
    events, except ``message_posted`` (chat) and ``absence_claimable`` (timer), whose ``seq``
    then followed other rules; dedupe those on ``id``. ``version`` is the table's version once
    the command that caused a table event was applied (the ``version`` of views); chat and
    timer events have none.
    """

    id: uuid.UUID
    type: str
    table_id: str
    stream: str = "table"
    seq: int
    version: int | None = None
    occurred_at: datetime
    schema_version: int = SCHEMA_VERSION
    data: AnyEvent


def wrap(
    table_id: str, seq: int, event: AnyEvent, occurred_at: datetime, version: int | None = None
) -> Envelope:
    """The envelope of one table event (the ``table`` stream)."""
    return Envelope(
        id=uuid.uuid4(),
        type=event.__struct_config__.tag,  # type: ignore[arg-type]
        table_id=table_id,
        stream="table",
        seq=seq,
        version=version,
        occurred_at=occurred_at.astimezone(UTC),
        data=event,
    )


envelope_decoder = msgspec.json.Decoder(Envelope)
