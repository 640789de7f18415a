"""The envelope every published event travels in (docs/DESIGN.md section 3)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec

from shared.contracts.events import AnyEvent

SCHEMA_VERSION = 1


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """One event of one table: ``(table_id, seq)`` is unique and gap-free per table."""

    id: uuid.UUID
    type: str
    table_id: str
    seq: int
    occurred_at: datetime
    schema_version: int = SCHEMA_VERSION
    data: AnyEvent


def wrap(table_id: str, seq: int, event: AnyEvent, occurred_at: datetime) -> Envelope:
    """The envelope of one event."""
    return Envelope(
        id=uuid.uuid4(),
        type=event.__struct_config__.tag,  # type: ignore[arg-type]
        table_id=table_id,
        seq=seq,
        occurred_at=occurred_at.astimezone(UTC),
        data=event,
    )


envelope_decoder = msgspec.json.Decoder(Envelope)
