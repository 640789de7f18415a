"""The chat learns from its own durable queue, once per event: a restart loses nothing, a
repeated event changes nothing, a poison message is dead-lettered and the consumer goes on."""

from __future__ import annotations

import uuid
import zlib
from datetime import UTC, datetime
from typing import Any

import aio_pika
import asyncpg
import msgspec

from services.chat.app import SCHEMA
from services.chat.consumer import apply_event
from shared.contracts.envelope import Envelope, wrap
from shared.contracts.events import Player, SeatTaken, TableClosed
from shared.contracts.names import DEAD_LETTER, EVENTS_EXCHANGE, chat_key, table_event_key
from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.chat.conftest import (
    ChatApi,
    chat_table,
    learned,
    open_chat,
    person,
    status_becomes,
)
from tests.chat.test_ops import metrics
from tests.table.conftest import Api, Clock, Tap, assert_error

NOW = datetime(2027, 1, 15, 12, 0, tzinfo=UTC)


async def publish(settings: Settings, *bodies: bytes, routing_key: str) -> None:
    """Publish as the table service's relay would (persistent, confirmed)."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(settings.prefix + EVENTS_EXCHANGE)
        for body in bodies:
            await exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=routing_key,
            )


def seat_taken(table_id: str, seq: int, seat: int, player: Player) -> Envelope:
    return wrap(table_id, seq, SeatTaken(seat=seat, player=player), NOW)


async def test_the_chat_restarted_loses_nothing_and_its_consumer_resumes(
    settings: Settings, api: Api
) -> None:
    clock = Clock()
    relay_lock = zlib.crc32(f"relay:{SCHEMA}".encode())  # the outbox relay's turn to publish
    db = await asyncpg.connect(settings.database_url, server_settings={"search_path": SCHEMA})
    try:
        async with Tap(settings, EVENTS_EXCHANGE, "chat.*.message_posted") as tap:
            async with open_chat(settings, clock) as chat:
                first, ana, bia = await chat_table(api, db)
                said = [await chat.say(first, ana, "um"), await chat.say(first, bia, "dois")]
                bodies = await tap.collect(lambda got: len(got) >= 2)  # published
                # The relay gets no turn now: the last message is stored, not yet published.
                await db.execute("SELECT pg_advisory_lock($1)", relay_lock)
                said.append(await chat.say(first, ana, "três"))
            unpublished = await db.fetch(
                "SELECT message_id FROM outbox WHERE published_at IS NULL AND routing_key = $1",
                chat_key(first),
            )
            assert [r["message_id"] for r in unpublished] == [said[-1]["id"]]
            await db.execute("SELECT pg_advisory_unlock($1)", relay_lock)

            # While the chat is down the table service goes on: a new table; the first closes.
            carla, duda = person(api, "Carla"), person(api, "Duda")
            created = await api.create(carla)
            second = created["table_id"]
            status, body = await api.call(
                "POST", f"/v1/tables/{second}/join", duda, {"invite_code": created["invite_code"]}
            )
            assert status == 200, body
            for command in ("resign", "decline_rematch"):
                status, body = await api.command(first, ana, type=command)
                assert status == 200, body

            async with open_chat(settings, clock) as chat:
                await learned(db, second)
                await status_becomes(db, first, "closed")
                assert await chat.all_messages(first) == said
                reply = await chat.post(first, bia, "ainda posso?")
                assert_error(reply.status, reply.body, 409, "table_closed", "R10.5")
                later = [await chat.say(second, duda, "oi"), await chat.say(second, carla, "olá")]
                assert [m["seq"] for m in later] == [1, 2]

                # Every message went out, the one the first app left behind included.
                wanted = {(m["table_id"], m["seq"]) for m in [*said, *later]}
                bodies += await tap.collect(
                    lambda got: wanted <= {(b["table_id"], b["seq"]) for b in [*bodies, *got]}
                )
    finally:
        await db.close()
    published = {(b["table_id"], b["seq"]): b for b in bodies}
    assert [published.get((m["table_id"], m["seq"])) for m in [*said, *later]] == [*said, *later]


async def test_the_same_table_event_twice_changes_nothing(
    settings: Settings, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id = f"t-{uuid.uuid4().hex[:12]}"
    ana = Player(id=f"ana-{table_id}", name="Ana")
    taken = msgspec.json.encode(seat_taken(table_id, 2, 0, ana))
    before = await metrics(chat)
    await publish(settings, taken, taken, routing_key=table_event_key(table_id, "seat_taken"))
    # One more event after the repeat: once it is applied, so is everything before it.
    bia = Player(id=f"bia-{table_id}", name="Bia")
    marker = msgspec.json.encode(seat_taken(table_id, 3, 1, bia))
    await publish(settings, marker, routing_key=table_event_key(table_id, "seat_taken"))
    await learned(chat_db, table_id)

    tracked = await chat_db.fetch(
        "SELECT seq, type FROM applied_events WHERE table_id = $1 ORDER BY seq", table_id
    )
    assert [tuple(r) for r in tracked] == [(2, "seat_taken"), (3, "seat_taken")]
    after = await metrics(chat)

    def delta(outcome: str) -> float:
        key = ("gin_chat_table_events_total", (("outcome", outcome), ("type", "seat_taken")))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("applied") == 2
    assert delta("duplicate") == 1

    # The tracking record makes a repeat harmless, whatever it says: a redelivered seq 2 that
    # put someone else in seat 0 would change nothing either.
    eve = Player(id="eve", name="Eve")
    closed = wrap(table_id, 9, TableClosed(reason="left"), NOW)
    transaction = chat_db.transaction()
    await transaction.start()
    try:
        assert await apply_event(chat_db, seat_taken(table_id, 2, 0, eve)) == "duplicate"
        assert await apply_event(chat_db, closed) == "applied"
        assert await apply_event(chat_db, closed) == "duplicate"
        assert await chat_db.fetchval(
            "SELECT status FROM tables WHERE table_id = $1", table_id
        ) == ("closed")
    finally:
        await transaction.rollback()  # the table stays open for the rest of the test
    seats = await chat_db.fetch(
        "SELECT seat, player_id, name FROM seats WHERE table_id = $1 ORDER BY seat", table_id
    )
    assert [tuple(s) for s in seats] == [(0, ana.id, "Ana"), (1, bia.id, "Bia")]

    token = mint(settings.auth_secret, str(ana.id), "Ana")
    said = await chat.say(table_id, token, "oi")
    assert (said["seq"], said["data"]["seat"], said["data"]["name"]) == (1, 0, "Ana")


async def test_a_poison_message_is_dead_lettered_and_the_consumer_goes_on(
    settings: Settings, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id = f"t-{uuid.uuid4().hex[:12]}"
    poison = f"not an envelope of {table_id}".encode()
    await publish(settings, poison, routing_key=table_event_key(table_id, "seat_taken"))
    player = Player(id=f"ana-{table_id}", name="Ana")
    marker = msgspec.json.encode(seat_taken(table_id, 2, 0, player))
    await publish(settings, marker, routing_key=table_event_key(table_id, "seat_taken"))
    await learned(chat_db, table_id, seats=1)

    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:  # closing gives back every other dead letter, unsettled
        channel = await connection.channel()
        dead = await channel.get_queue(settings.prefix + DEAD_LETTER)
        found: Any = None
        while found is None and (message := await dead.get(fail=False, timeout=5)) is not None:
            if message.body == poison:
                found = message
        assert found is not None, "the poison message was not dead-lettered"
        await found.ack()
