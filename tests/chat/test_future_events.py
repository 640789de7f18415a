"""Table events of a newer contract reach the chat's consumer (issue 15, part 2): an envelope
of a newer schema version or an unknown type is acknowledged and skipped, a known event with
new fields (in the envelope, the event, its player) is applied. Nothing is dead-lettered and
the consumer goes on in order. Real chat service, PostgreSQL and RabbitMQ.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aio_pika
import asyncpg
import msgspec

from shared.contracts.envelope import SCHEMA_VERSION
from shared.contracts.names import DEAD_LETTER, EVENTS_EXCHANGE, table_event_key
from shared.infra.settings import Settings
from tests.chat.conftest import ChatApi, learned


def seat_taken(table_id: str, seq: int, seat: int, name: str, **envelope: Any) -> bytes:
    body = {
        "id": str(uuid.uuid4()),
        "type": "seat_taken",
        "table_id": table_id,
        "stream": "table",
        "seq": seq,
        "occurred_at": "2026-01-02T03:04:05Z",
        "schema_version": SCHEMA_VERSION,
        "data": {"type": "seat_taken", "seat": seat, "player": {"name": name, "id": name}},
        **envelope,
    }
    return msgspec.json.encode(body)


async def test_the_chat_skips_what_it_does_not_know_and_reads_new_fields(
    settings: Settings, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id = f"future-{uuid.uuid4().hex[:8]}"
    key = table_event_key(table_id, "seat_taken")
    newer = seat_taken(table_id, 1, 0, "zed", schema_version=SCHEMA_VERSION + 1)
    unknown = msgspec.json.decode(seat_taken(table_id, 2, 0, "zed"))
    unknown["type"] = unknown["data"]["type"] = "seat_reserved"
    known = msgspec.json.decode(seat_taken(table_id, 3, 1, "ana", trace_id="t-1"))
    known["data"]["since_lobby"] = True
    known["data"]["player"]["pronouns"] = "she/her"
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(settings.prefix + EVENTS_EXCHANGE)
        dead = await channel.declare_queue(settings.prefix + DEAD_LETTER, passive=True)
        await dead.purge()
        for body in (newer, msgspec.json.encode(unknown), msgspec.json.encode(known)):
            await exchange.publish(aio_pika.Message(body), routing_key=key)
        await learned(chat_db, table_id, seats=1)
        seats = await chat_db.fetch(
            "SELECT seat, player_id FROM seats WHERE table_id = $1", table_id
        )
        assert [(r["seat"], r["player_id"]) for r in seats] == [(1, "ana")]  # zed: skipped
        applied = await chat_db.fetch(
            "SELECT seq FROM applied_events WHERE table_id = $1", table_id
        )
        assert [r["seq"] for r in applied] == [3]
        await asyncio.sleep(0.3)
        dead = await channel.declare_queue(settings.prefix + DEAD_LETTER, passive=True)
        assert dead.declaration_result.message_count == 0
