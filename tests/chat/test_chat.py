"""The chat of a table (R10.5, docs/DESIGN.md section 7) against the real chat and table services:
who writes, who reads, every limit, the history's pages, and a closed table's chat."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import asyncpg
import msgspec
import pytest

from shared.contracts.names import COMMANDS_QUEUE
from shared.infra.auth import Verifier, mint
from shared.infra.settings import Settings
from tests.chat.conftest import ChatApi, chat_table, learned, person, status_becomes
from tests.table.conftest import Api, Clock, assert_error, open_api


def seqs(page: list[dict[str, Any]]) -> list[int]:
    return [m["seq"] for m in page]


async def test_r10_5_two_players_chat_and_anyone_reads(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await chat_table(api, chat_db)
    first = await chat.say(table_id, ana, "  oi, bom jogo!  ")
    second = await chat.say(table_id, bia, "obrigada, igualmente 🂡 <b>&amp;</b>")

    assert first["type"] == "message_posted"
    assert first["table_id"] == table_id
    assert (first["stream"], first["seq"], first["version"]) == ("chat", 1, None)  # its own stream
    assert first["data"] == {
        "type": "message_posted",
        "message_id": 1,
        "seat": 0,
        "name": "Ana",
        "text": "oi, bom jogo!",  # trimmed
    }
    assert second["seq"] == 2
    assert second["data"]["seat"] == 1
    assert second["data"]["name"] == "Bia"
    assert second["data"]["text"] == "obrigada, igualmente 🂡 <b>&amp;</b>"  # as written

    # Anyone reads, without a token: the same envelopes, byte for byte.
    reply = await chat.history(table_id)
    assert reply.status == 200
    assert reply.body == [first, second]
    assert reply.headers["Content-Type"].startswith("application/json")


async def test_a_spectator_reads_and_is_refused_writing(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    await chat.say(table_id, ana, "oi")
    eve = person(api, "Eve")

    reply = await chat.post(table_id, eve, "posso falar?")
    assert_error(reply.status, reply.body, 403, "spectators_cannot_chat", "R10.5")
    reply = await chat.history(table_id)
    assert reply.status == 200
    assert [m["data"]["text"] for m in reply.body] == ["oi"]
    # A spectator's token is not needed to read, and is no harm either.
    assert (await chat.call("GET", f"/v1/tables/{table_id}/messages", eve)).body == reply.body


async def test_r10_5_a_bot_seat_never_posts(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    """The chat knows the bot's seat, and no token is the bot's: it has no player id."""
    ana = person(api, "Ana")
    ana_id = Verifier.from_settings(api.settings).verify(ana).id
    table_id = (await api.create(ana))["table_id"]
    status, body = await api.call("POST", f"/v1/tables/{table_id}/bot", ana, {"level": "tito"})
    assert status == 200, body
    await learned(chat_db, table_id)
    seats = await chat_db.fetch(
        "SELECT seat, player_id, name, bot FROM seats WHERE table_id = $1 ORDER BY seat", table_id
    )
    assert [dict(s) for s in seats] == [
        {"seat": 0, "player_id": ana_id, "name": "Ana", "bot": None},
        {"seat": 1, "player_id": None, "name": "TITO", "bot": "tito"},
    ]

    await chat.say(table_id, ana, "boa sorte, TITO")
    for sub in ("TITO", "tito", "bot", "bot:tito", "bot:1", "None", "null"):
        token = mint(api.settings.auth_secret, sub, "TITO")
        reply = await chat.post(table_id, token, "sou o TITO")
        assert_error(reply.status, reply.body, 403, "spectators_cannot_chat", "R10.5")
    history = (await chat.history(table_id)).body
    assert [(m["data"]["seat"], m["data"]["text"]) for m in history] == [(0, "boa sorte, TITO")]


async def test_r10_5_one_writes_while_waiting_and_a_closed_tables_chat_is_read_only(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    ana = person(api, "Ana")
    table_id = (await api.create(ana))["table_id"]
    await learned(chat_db, table_id, seats=1)
    said = await chat.say(table_id, ana, "alguém para jogar?")
    status, body = await api.command(table_id, ana, type="leave")
    assert status == 200, body
    await status_becomes(chat_db, table_id, "closed")

    reply = await chat.post(table_id, ana, "tchau")
    assert_error(reply.status, reply.body, 409, "table_closed", "R10.5")
    assert (await chat.history(table_id)).body == [said]


async def test_r10_5_an_expired_table_is_read_only(
    settings: Settings, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    """The table service expires the table (the timer's command, R10.3); its chat stays."""
    clock = Clock()
    async with open_api(settings, clock=clock) as api:
        table_id, ana, bia = await chat_table(api, chat_db)
        said = await chat.say(table_id, bia, "volto já")
        clock.advance(settings.expiry_after_s + 1)
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            channel = await connection.channel()
            expire = {"table_id": table_id, "source": "timer", "command": {"type": "expire"}}
            await channel.default_exchange.publish(
                aio_pika.Message(msgspec.json.encode(expire)),
                routing_key=settings.prefix + COMMANDS_QUEUE,
            )
        await status_becomes(chat_db, table_id, "expired")
        assert (await api.view(table_id))["status"] == "expired"

    for token in (ana, bia):
        reply = await chat.post(table_id, token, "ainda aqui?")
        assert_error(reply.status, reply.body, 409, "table_closed", "R10.5")
    assert (await chat.history(table_id)).body == [said]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("   \t\n  ", "only spaces: empty after trimming"),
        ("x" * 501, "501 characters"),
        (" " + "🂡" * 501, "501 characters of four bytes each"),
        ("oi\nBia", "a newline"),
        ("oi\r\nBia", "a carriage return"),
        ("oi\tBia", "a tab"),
        ("oi\x00", "NUL"),
        ("o\x1bi", "ESC"),
        ("oi\x7f!", "DEL"),
        ("oi\x85Bia", "a C1 control (NEL)"),
        ("\x9boi", "a C1 control (CSI)"),
    ],
)
async def test_text_limits_are_refused(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection, text: str, why: str
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    reply = await chat.post(table_id, ana, text)
    assert_error(reply.status, reply.body, 400, "invalid_text", None)
    assert (await chat.history(table_id)).body == [], why


async def test_text_at_the_limits_is_accepted_and_stored_as_written(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await chat_table(api, chat_db)
    texts = [
        "x",
        "y" * 500,
        "🂡" * 500,  # characters, not bytes
        "\u200bzero\u200dwidth\u202e and bidi are not control characters",
        "<script>alert(1)</script> & ' \" \\",
    ]
    posted = [await chat.say(table_id, ana if n % 2 else bia, text) for n, text in enumerate(texts)]
    assert [m["data"]["text"] for m in posted] == texts
    assert [m["data"]["text"] for m in (await chat.history(table_id)).body] == texts
    padded = await chat.say(table_id, ana, "\n " + "z" * 500 + " \t")
    assert padded["data"]["text"] == "z" * 500


async def test_the_sixth_message_within_ten_seconds_waits(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await chat_table(api, chat_db)
    for n in range(5):
        await chat.say(table_id, ana, f"msg {n}")
        chat.clock.advance(1.0)
    # Messages at t, t+1, ..., t+4; now t+5: the first leaves the window at t+10.
    reply = await chat.post(table_id, ana, "a sexta")
    assert_error(reply.status, reply.body, 429, "too_many_messages", None)
    assert reply.headers["Retry-After"] == "5"
    chat.clock.advance(4.5)
    reply = await chat.post(table_id, ana, "ainda não")
    assert_error(reply.status, reply.body, 429, "too_many_messages", None)
    assert reply.headers["Retry-After"] == "1"  # whole seconds, rounded up
    await chat.say(table_id, bia, "eu posso")  # the limit is each player's own

    chat.clock.advance(0.5)  # t+10: the first message left the window
    sixth = await chat.say(table_id, ana, "a sexta")
    reply = await chat.post(table_id, ana, "a sétima")  # t+1 ... t+4 and t+10 are 5
    assert reply.status == 429
    assert reply.headers["Retry-After"] == "1"
    chat.clock.advance(1.0)
    seventh = await chat.say(table_id, ana, "a sétima")
    assert [sixth["seq"], seventh["seq"]] == [7, 8]  # refused messages took no number
    assert seqs((await chat.history(table_id)).body) == list(range(1, 9))


async def test_the_limit_holds_at_all_a_players_tables_together(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    ana = person(api, "Ana")
    tables = []
    for _ in range(2):
        created = await api.create(ana)
        await learned(chat_db, created["table_id"], seats=1)
        tables.append(created["table_id"])
    for n in range(5):
        await chat.say(tables[n % 2], ana, f"msg {n}")
    for table_id in tables:
        reply = await chat.post(table_id, ana, "mais uma")
        assert_error(reply.status, reply.body, 429, "too_many_messages", None)
        assert reply.headers["Retry-After"] == "10"


async def test_concurrent_messages_are_numbered_without_gaps(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection
) -> None:
    table_id, ana, bia = await chat_table(api, chat_db)
    replies = await asyncio.gather(
        *(chat.post(table_id, token, f"{n}") for n in range(5) for token in (ana, bia))
    )
    assert all(r.status == 201 for r in replies), replies
    assert sorted(r.body["seq"] for r in replies) == list(range(1, 11))
    history = (await chat.history(table_id)).body
    assert seqs(history) == list(range(1, 11))
    assert [m["data"]["message_id"] for m in history] == list(range(1, 11))
    # Three more at once from Ana: five are hers already, so all three wait.
    replies = await asyncio.gather(*(chat.post(table_id, ana, "!") for _ in range(3)))
    assert [r.status for r in replies] == [429, 429, 429]


async def test_history_pages(api: Api, chat: ChatApi, chat_db: asyncpg.Connection) -> None:
    table_id, ana, bia = await chat_table(api, chat_db)
    posted = []
    for n in range(105):
        posted.append(await chat.say(table_id, ana if n % 2 else bia, f"message {n + 1}"))
        chat.clock.advance(1.0)  # each player writes every 2 s: never 5 within 10 s

    assert seqs(posted) == list(range(1, 106))
    assert (await chat.history(table_id, limit=3)).body == posted[:3]
    assert (await chat.history(table_id, after=3, limit=3)).body == posted[3:6]
    assert (await chat.history(table_id, after=104, limit=3)).body == posted[104:]
    assert (await chat.history(table_id, after=105)).body == []
    assert (await chat.history(table_id, after=500)).body == []
    assert (await chat.history(table_id)).body == posted[:50]  # 50 by default
    assert (await chat.history(table_id, after=10, limit=1000)).body == posted[
        10:110
    ]  # 100 at most
    assert await chat.all_messages(table_id) == posted


@pytest.mark.parametrize("query", ["after=-1", "after=x", "limit=0", "limit=1.5", "after=1e3"])
async def test_a_bad_history_query_is_refused(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection, query: str
) -> None:
    table_id, _, _ = await chat_table(api, chat_db)
    reply = await chat.call("GET", f"/v1/tables/{table_id}/messages?{query}")
    assert_error(reply.status, reply.body, 400, "invalid_request", None)


async def test_a_table_the_chat_has_not_heard_of(api: Api, chat: ChatApi) -> None:
    ana = person(api, "Ana")
    for reply in (await chat.post("no-such-table", ana, "oi"), await chat.history("no-such-table")):
        assert_error(reply.status, reply.body, 404, "no_such_table", None)


async def test_bad_requests_are_refused_in_the_one_error_shape(
    api: Api, chat: ChatApi, chat_db: asyncpg.Connection, settings: Settings
) -> None:
    table_id, ana, _ = await chat_table(api, chat_db)
    path = f"/v1/tables/{table_id}/messages"
    cases = [
        (await chat.post(table_id, None, "oi"), 401, "unauthorized"),
        (await chat.post(table_id, "not-a-token", "oi"), 401, "unauthorized"),
        (
            await chat.post(table_id, mint("another-secret" * 3, "x", "X"), "oi"),
            401,
            "unauthorized",
        ),
        (await chat.call("POST", path, ana, raw=b"oi"), 400, "malformed_json"),
        (await chat.call("POST", path, ana, raw=b""), 400, "malformed_json"),
        (await chat.call("POST", path, ana, {}), 400, "invalid_request"),
        (await chat.call("POST", path, ana, {"text": 7}), 400, "invalid_request"),
        (await chat.call("POST", path, ana, {"text": "oi", "seat": 1}), 400, "invalid_request"),
        (await chat.call("POST", path, ana, raw=b'{"text": "\\ud800"}'), 400, "malformed_json"),
        (await chat.call("POST", path, ana, raw=b'{"text": "\xff"}'), 400, "malformed_json"),
    ]
    for reply, status, code in cases:
        assert_error(reply.status, reply.body, status, code, None)
    assert (await chat.history(table_id)).body == []
