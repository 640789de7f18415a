"""The table WebSocket (docs/DESIGN.md section 7): a snapshot, then every event once, in order, with
the viewer's view; commands from a seated client; catching up after a reconnect."""

from __future__ import annotations

import contextlib
import random
import uuid
from datetime import UTC, datetime
from typing import Any

import aio_pika
import aiohttp
import asyncpg
import msgspec
import pytest

from services.table.ws import HUB
from shared.contracts.envelope import Envelope, wrap
from shared.contracts.events import MessagePosted, TurnReminder
from shared.contracts.names import EVENTS_EXCHANGE, chat_key, timer_key
from shared.infra.auth import mint
from shared.infra.service import POOL
from shared.infra.settings import Settings
from tests.table.conftest import (
    Api,
    all_events,
    assert_error,
    assert_error_detail,
    published,
    ws_receive,
    ws_silent,
    ws_until,
)


def ws_path(table_id: str, token: str | None = None) -> str:
    return f"/v1/tables/{table_id}/ws" + (f"?token={token}" if token else "")


def event_seqs(messages: list[dict[str, Any]]) -> list[int]:
    return [m["event"]["seq"] for m in messages if m["kind"] == "event"]


def reached(seq: int) -> Any:
    return lambda messages: seq in event_seqs(messages)


async def play(
    api: Api, table_id: str, tokens: list[str], moves: int, rng: random.Random
) -> list[dict[str, Any]]:
    """``moves`` legal moves by whoever is to act (never resign or leave); their results."""
    results = []
    for _ in range(moves):
        public = await api.view(table_id)
        seat = public["hand"]["to_act"]
        view = await api.view(table_id, tokens[seat])
        legal = [m for m in view["legal"] if m["type"] not in ("resign", "leave")]
        status, body = await api.command(table_id, tokens[seat], **rng.choice(legal))
        assert status == 200, body
        results.append(body)
    return results


async def test_a_seated_client_gets_a_snapshot_then_every_event_once_in_order(
    api: Api, db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await api.table_for_two()
    await published(db, table_id)  # the join's events are out before the socket opens
    log = await all_events(api, table_id)
    async with api.client.ws_connect(ws_path(table_id, ana)) as ws:
        snapshot = await ws_receive(ws)
        assert snapshot["kind"] == "snapshot"
        assert snapshot["view"] == await api.view(table_id, ana)
        assert snapshot["view"]["you"] == 0
        assert len(snapshot["view"]["hand"]["my_cards"]) == 10

        results = await play(api, table_id, [ana, bia], 8, random.Random(4))
        last = results[-1]["events"][-1]["seq"]
        messages = await ws_until(ws, reached(last))
        await ws_silent(ws)  # nothing more, nothing twice
        assert all(m["kind"] == "event" for m in messages), messages
        seqs = event_seqs(messages)
        assert seqs == list(range(log[-1]["seq"] + 1, last + 1))
        logged = {e["seq"]: e for e in await all_events(api, table_id)}
        version_of = {e["seq"]: r["version"] for r in results for e in r["events"]}
        for message in messages:
            event, view = message["event"], message["view"]
            assert event == logged[event["seq"]]
            assert view["you"] == 0
            assert "my_cards" in view["hand"]
            assert version_of[event["seq"]] <= view["version"] <= results[-1]["version"]
        assert messages[-1]["view"] == await api.view(table_id, ana)
        assert ws.closed is False
    assert ws.closed


async def test_a_socket_sends_nothing_twice(api: Api, db: asyncpg.Connection) -> None:
    table_id, ana, bia = await api.table_for_two()
    await published(db, table_id)
    async with api.client.ws_connect(ws_path(table_id)) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        results = await play(api, table_id, [ana, bia], 4, random.Random(9))
        last = results[-1]["events"][-1]["seq"]
        messages = await ws_until(ws, reached(last))
        await ws_silent(ws, 0.5)
        seqs = event_seqs(messages)
        assert len(seqs) == len(set(seqs))
        assert seqs == sorted(seqs)
        assert all("my_cards" not in m["view"]["hand"] for m in messages)
        assert all(m["view"]["you"] is None for m in messages)


async def test_a_seated_client_sends_commands_on_the_socket(
    api: Api, db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await api.table_for_two()
    await published(db, table_id)
    public = await api.view(table_id)
    seat = public["hand"]["to_act"]
    tokens = [ana, bia]
    async with api.client.ws_connect(ws_path(table_id, tokens[seat])) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        command = {"type": "pass_upcard", "command_id": "ws-pass-1"}
        await ws.send_json({"kind": "command", "command": command})
        messages = await ws_until(
            ws, lambda ms: any(m["kind"] == "result" for m in ms) and bool(event_seqs(ms))
        )
        result = next(m["result"] for m in messages if m["kind"] == "result")
        assert result["version"] == public["version"] + 1
        assert [e["type"] for e in result["events"]] == ["upcard_passed"]
        assert result["events"][0]["data"]["seat"] == seat
        assert result["view"]["you"] == seat
        assert result["view"]["hand"]["to_act"] == 1 - seat
        log = await all_events(api, table_id)
        assert log[-1] == result["events"][0]
        event = next(m for m in messages if m["kind"] == "event")
        assert event["event"] == result["events"][0]

        # The same command again: the same answer, applied once.
        await ws.send_json({"kind": "command", "command": command})
        again = await ws_until(ws, lambda ms: any(m["kind"] == "result" for m in ms))
        assert next(m["result"] for m in again if m["kind"] == "result") == result
        assert await all_events(api, table_id) == log

        # Refused: not this seat's turn now; a bad card; not JSON; not a command message.
        for sent, code, rule in (
            ({"kind": "command", "command": {"type": "take_upcard"}}, "not_your_turn", "R5.4"),
            (
                {"kind": "command", "command": {"type": "discard", "card": "Zz"}},
                "not_your_turn",
                "R5.4",
            ),
            ("{not json", "malformed_json", None),
            ({"kind": "chat", "text": "oi"}, "invalid_request", None),
            ({"kind": "command", "command": {"type": "draw"}}, "invalid_request", None),
        ):
            if isinstance(sent, str):
                await ws.send_str(sent)
            else:
                await ws.send_json(sent)
            reply = await ws_receive(ws)
            assert reply["kind"] == "error", reply
            assert_error_detail(reply["error"], code, rule)
        assert await all_events(api, table_id) == log
        assert (await api.view(table_id))["version"] == result["version"]


async def test_an_unknown_command_type_is_named_alike_on_the_socket_and_over_http(
    api: Api, db: asyncpg.Connection
) -> None:
    table_id, ana, _ = await api.table_for_two()
    status, body = await api.command(table_id, ana, type="fold")
    assert_error(status, body, 400, "unknown_command", None)
    async with api.client.ws_connect(ws_path(table_id, ana)) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        await ws.send_json({"kind": "command", "command": {"type": "fold"}})
        reply = await ws_until(ws, lambda ms: any(m["kind"] == "error" for m in ms))
        error = next(m["error"] for m in reply if m["kind"] == "error")
        assert error["code"] == "unknown_command"


async def test_a_spectator_may_not_send_commands(api: Api, db: asyncpg.Connection) -> None:
    table_id, ana, bia = await api.table_for_two()
    await published(db, table_id)
    log = await all_events(api, table_id)
    caio = api.token("Caio")
    async with (
        api.client.ws_connect(ws_path(table_id)) as anonymous,
        api.client.ws_connect(ws_path(table_id, caio)) as watcher,
    ):
        for ws, code in ((anonymous, "unauthorized"), (watcher, "not_seated")):
            snapshot = await ws_receive(ws)
            assert snapshot["kind"] == "snapshot"
            assert snapshot["view"]["you"] is None
            assert snapshot["view"]["legal"] == []
            for command in ({"type": "pass_upcard"}, {"type": "take_upcard"}, {"type": "resign"}):
                await ws.send_json({"kind": "command", "command": command})
                reply = await ws_receive(ws)
                assert reply["kind"] == "error", reply
                assert reply["error"]["code"] == code
        assert await all_events(api, table_id) == log
        # Both still watch: the next event reaches them.
        results = await play(api, table_id, [ana, bia], 1, random.Random(1))
        seq = results[0]["events"][-1]["seq"]
        for ws in (anonymous, watcher):
            messages = await ws_until(ws, reached(seq))
            assert event_seqs(messages) == [e["seq"] for e in results[0]["events"]]


async def test_a_reconnecting_client_catches_up_with_the_event_log(
    api: Api, db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    rng = random.Random(12)
    await published(db, table_id)
    async with api.client.ws_connect(ws_path(table_id, ana)) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        results = await play(api, table_id, tokens, 2, rng)
        seen = results[-1]["events"][-1]["seq"]
        await ws_until(ws, reached(seen))
    # Offline: three more moves happen.
    missed = await play(api, table_id, tokens, 3, rng)
    status, page = await api.call("GET", f"/v1/tables/{table_id}/events?after={seen}")
    assert status == 200
    assert page == [e for r in missed for e in r["events"]]
    assert [e["seq"] for e in page] == list(range(seen + 1, seen + 1 + len(page)))
    status, limited = await api.call("GET", f"/v1/tables/{table_id}/events?after={seen}&limit=1")
    assert status == 200
    assert limited == page[:1]

    await published(db, table_id)
    async with api.client.ws_connect(ws_path(table_id, ana)) as ws:
        snapshot = await ws_receive(ws)
        assert snapshot["kind"] == "snapshot"
        assert snapshot["view"] == await api.view(table_id, ana)
        more = await play(api, table_id, tokens, 1, rng)
        last = more[0]["events"][-1]["seq"]
        messages = await ws_until(ws, reached(last))
        assert event_seqs(messages) == list(range(page[-1]["seq"] + 1, last + 1))


async def test_the_snapshot_is_the_first_message_even_when_it_is_slow(
    api: Api, db: asyncpg.Connection, settings: Settings
) -> None:
    """Deterministic: the snapshot is held up (a lock on the deck designs it reads, as a slow
    database would) while the chat service posts on the table; the snapshot comes first."""
    table_id, ana, _ = await api.table_for_two()
    await published(db, table_id)
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(settings.prefix + EVENTS_EXCHANGE)
        lock = db.transaction()
        await lock.start()
        locked = True
        try:
            await db.execute("LOCK TABLE preferences IN ACCESS EXCLUSIVE MODE")
            ws = await api.client.ws_connect(ws_path(table_id, ana))
            try:
                first = None
                for n in range(1, 21):  # until the socket is attached and hears one
                    posted = MessagePosted(message_id=n, seat=1, name="Bia", text=f"oi {n}")
                    envelope = wrap(table_id, n, posted, datetime.now(UTC))
                    await exchange.publish(
                        aio_pika.Message(msgspec.json.encode(envelope)),
                        routing_key=chat_key(table_id),
                    )
                    with contextlib.suppress(TimeoutError):
                        first = await ws_receive(ws, within_s=0.1)
                        break
                await lock.rollback()
                locked = False
                rest = await ws_until(ws, lambda ms: any(m["kind"] == "snapshot" for m in ms))
            finally:
                await ws.close()
        finally:
            if locked:
                await lock.rollback()
    kinds = [m["kind"] for m in ([first] if first else []) + rest]
    assert kinds[0] == "snapshot", f"the socket sent {kinds}"


async def test_a_socket_with_a_bad_token_or_table_is_refused(api: Api, settings: Settings) -> None:
    table_id, _, _ = await api.table_for_two()
    # Expired past the leeway the verifier allows for clock skew.
    expired = mint(settings.auth_secret, "user-x", "X", ttl_s=-(settings.auth_leeway_s + 60))
    for token in (expired, "not-a-jwt"):
        status, error = await api.call("GET", ws_path(table_id, token))
        assert_error(status, error, 401, "unauthorized", None)
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await api.client.ws_connect(ws_path(table_id, token))
        assert refused.value.status == 401
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await api.client.ws_connect(ws_path("no-such-table"))
    assert refused.value.status == 404


async def test_a_watched_tables_snapshot_comes_from_memory_and_stays_current(
    api: Api, db: asyncpg.Connection
) -> None:
    """While a table is watched, the replica keeps its newest row: a new watcher's snapshot
    needs no database connection (every one held here), and after a move it shows the move."""
    table_id, ana, bia = await api.table_for_two()
    rng = random.Random(5)
    first = await api.client.ws_connect(ws_path(table_id))
    try:
        await play(api, table_id, [ana, bia], 3, rng)
        version = (await api.view(table_id))["version"]
        await ws_until(
            first, lambda ms: any(m.get("view", {}).get("version") == version for m in ms)
        )
        pool: asyncpg.Pool = api.client.app[POOL]
        held = []
        try:
            while True:
                try:
                    held.append(await pool.acquire(timeout=0.3))
                except TimeoutError:
                    break
            async with api.client.ws_connect(ws_path(table_id)) as second:
                snapshot = await ws_receive(second, within_s=5)
            assert snapshot["kind"] == "snapshot"
            assert snapshot["view"]["version"] == version
            assert snapshot["view"]["you"] is None
        finally:
            for conn in held:
                await pool.release(conn)
        await play(api, table_id, [ana, bia], 1, rng)
        async with api.client.ws_connect(ws_path(table_id)) as third:
            snapshot = await ws_receive(third, within_s=5)
        assert snapshot["view"]["version"] == version + 1
        assert snapshot["view"] == await api.view(table_id)
    finally:
        await first.close()


async def chat_until_heard(settings: Settings, table_id: str, ws: Any) -> dict[str, Any] | None:
    """Post the table's chat as the chat service would, a message every 0.1 s, until the
    socket hears one (its first frame), or None after 100."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(settings.prefix + EVENTS_EXCHANGE)
        for n in range(1, 101):
            posted = MessagePosted(message_id=n, seat=1, name="Bia", text=f"oi {n}")
            envelope = wrap(table_id, n, posted, datetime.now(UTC))
            await exchange.publish(
                aio_pika.Message(msgspec.json.encode(envelope)), routing_key=chat_key(table_id)
            )
            with contextlib.suppress(TimeoutError):
                return await ws_receive(ws, within_s=0.1)
    return None


async def test_a_socket_opened_while_the_hubs_channel_is_away_is_served(
    api: Api, settings: Settings
) -> None:
    """A socket's first watcher of a table comes while the hub's broker channel is closed (a
    broker node stopping): the bind fails, yet the socket gets its snapshot, not a 500, and
    the table's chat once the channel is back (the hub binds it then). Chat posted before
    the bind never reached this replica: once bound, the socket is sent a snapshot again,
    the client's cue to read the messages it missed (DESIGN §7)."""
    hub = api.client.server.app[HUB]
    table_id, ana, _ = await api.table_for_two()
    assert hub.channel is not None
    await hub.channel.close()
    ws = await api.client.ws_connect(ws_path(table_id, ana))
    try:
        first = await ws_receive(ws)
        assert first["kind"] == "snapshot"
        assert table_id in hub.unbound
        await hub.channel.reopen()  # as aio-pika does after a reconnect: the hub consumes again
        again = await ws_receive(ws)  # once the hub has bound the table
        assert again["kind"] == "snapshot", again
        assert not hub.unbound
        assert again["view"]["version"] == first["view"]["version"]
        assert again["view"]["you"] == 0  # the seat's own view, as the first
        assert again["view"]["hand"]["my_cards"] == first["view"]["hand"]["my_cards"]
        heard = await chat_until_heard(settings, table_id, ws)
        assert heard is not None
        assert heard["event"]["type"] == "message_posted"
        with pytest.raises(TimeoutError):  # one snapshot again, not one per retry
            await ws_receive(ws, within_s=0.5)
    finally:
        await ws.close()


async def test_a_turn_reminder_reaches_the_tables_sockets_once(
    api: Api, settings: Settings
) -> None:
    """Issue 33: the timers' turn_reminder (timer stream) goes to the table's watchers like
    absence_claimable, once by id; a timer event of a newer contract is skipped."""
    table_id, ana, _ = await api.table_for_two()
    since = datetime.now(UTC)
    reminder = Envelope(
        id=uuid.uuid4(),
        type="turn_reminder",
        table_id=table_id,
        stream="timer",
        seq=1,
        occurred_at=since,
        data=TurnReminder(
            seat=1,
            since=since,
            waited_s=86400.0,
            claimable_at=since,
            reminder="waiting",
            after_s=86400.0,
            table_seq=3,
        ),
    )
    ws = await api.client.ws_connect(ws_path(table_id, ana))
    try:
        assert (await ws_receive(ws))["kind"] == "snapshot"
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.get_exchange(settings.prefix + EVENTS_EXCHANGE)

            async def publish(body: bytes, key: str) -> None:
                await exchange.publish(aio_pika.Message(body), routing_key=key)

            heard = None
            for _ in range(100):  # until the hub has bound the table's timer events
                await publish(msgspec.json.encode(reminder), timer_key(table_id, "turn_reminder"))
                with contextlib.suppress(TimeoutError):
                    heard = await ws_receive(ws, within_s=0.1)
                    break
            assert heard is not None
            assert heard["kind"] == "event"
            assert heard["event"]["id"] == str(reminder.id)
            assert heard["event"]["data"]["reminder"] == "waiting"
            newer = {**msgspec.to_builtins(reminder), "id": str(uuid.uuid4()), "seq": 2}
            newer["type"] = newer["data"]["type"] = "turn_nudged"  # a newer contract's type
            await publish(msgspec.json.encode(reminder), timer_key(table_id, "turn_reminder"))
            await publish(msgspec.json.encode(newer), timer_key(table_id, "turn_nudged"))
            chat = MessagePosted(message_id=1, seat=1, name="Bia", text="oi")
            posted = wrap(table_id, 1, chat, since)
            await publish(msgspec.json.encode(posted), chat_key(table_id))
            # the next frame is the chat message: the repeat and the unknown type sent nothing
            marker = await ws_receive(ws, within_s=10)
        assert marker["event"]["type"] == "message_posted", marker
    finally:
        await ws.close()


async def test_a_hub_channel_closed_alone_is_reopened_and_consumed_again(
    api: Api, settings: Settings
) -> None:
    """The broker closes the hub's channel and not the connection (here a channel error: a
    passive declare of a missing queue). aio-pika reopens the channel and declares the queue
    again, and the hub consumes it again: the table's chat still reaches its sockets. What
    was posted while the queue was gone is lost to the hub: each socket is sent a snapshot
    again, the client's cue to read it back (DESIGN §7)."""
    hub = api.client.server.app[HUB]
    table_id, ana, _ = await api.table_for_two()
    channel = hub.channel
    assert channel is not None
    ws = await api.client.ws_connect(ws_path(table_id, ana))
    try:
        first = await ws_receive(ws)
        assert first["kind"] == "snapshot"
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await channel.declare_queue(f"no-such-queue-{uuid.uuid4().hex}", passive=True)
        again = await ws_receive(ws)  # once the hub consumes again
        assert again["kind"] == "snapshot", again
        assert again["view"]["version"] == first["view"]["version"]
        heard = await chat_until_heard(settings, table_id, ws)
        assert heard is not None, "no chat message reached the socket after the channel closed"
        assert heard["event"]["type"] == "message_posted"
        assert not channel.is_closed
    finally:
        await ws.close()
