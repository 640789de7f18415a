"""A whole match between two people over HTTP; its events on RabbitMQ once per seq, in order."""

from __future__ import annotations

import asyncio

import aio_pika
import msgspec

from shared.contracts.envelope import envelope_decoder
from shared.contracts.names import EVENTS_EXCHANGE
from shared.infra.settings import Settings
from tests.table.conftest import Api, play_to_the_end


async def test_whole_match_over_http_with_every_event_once_in_order(
    api: Api, settings: Settings
) -> None:
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(settings.prefix + EVENTS_EXCHANGE)
        queue = await channel.declare_queue(exclusive=True)
        table_id, a, b = await api.table_for_two({"target": 30})
        await queue.bind(exchange, f"table.{table_id}.*")
        final = await play_to_the_end(api, table_id, [a, b], seed=3)
        assert final["status"] == "match_over"
        assert final["match"]["result"]["reason"] == "target"
        winner = final["match"]["result"]["winner"]
        assert final["match"]["scores"][winner] >= 30

        logged: list[dict] = []
        while True:  # the log comes in pages
            status, page = await api.call(
                "GET", f"/v1/tables/{table_id}/events?after={len(logged)}"
            )
            assert status == 200
            if not page:
                break
            logged += page
        last_seq = logged[-1]["seq"]
        assert [e["seq"] for e in logged] == list(range(1, last_seq + 1))

        # The queue was bound after the table was created and joined: it gets the rest.
        first_bound = next(e["seq"] for e in logged if e["data"]["type"] == "hand_started") + 1
        received: list[int] = []
        deadline = asyncio.get_running_loop().time() + 20
        while (
            not received or received[-1] < last_seq
        ) and asyncio.get_running_loop().time() < deadline:
            message = await queue.get(fail=False, timeout=5)
            if message is None:
                await asyncio.sleep(0.1)
                continue
            await message.ack()
            envelope = envelope_decoder.decode(message.body)
            assert envelope.table_id == table_id
            if not received or envelope.seq != received[-1]:  # at-least-once: skip a repeat
                received.append(envelope.seq)
        assert received == list(range(received[0], last_seq + 1))
        assert received[0] <= first_bound
        by_seq = {e["seq"]: e for e in logged}
        ended = [e for e in logged if e["data"]["type"] == "hand_ended"]
        assert ended, "no hand ended"
        status, record = await api.call(
            "GET", f"/v1/tables/{table_id}/hands/{ended[0]['data']['hand']}"
        )
        assert status == 200
        assert record == ended[0]["data"]
        assert msgspec.json.encode(by_seq[last_seq]["data"]["type"]) == b'"match_ended"'


async def test_r9_11_a_hollywood_match_over_http_carries_the_three_columns(api: Api) -> None:
    """R9.6 to R9.11 through the table service: the option is kept, the views carry
    ``match.games`` until all three games have closed, the record and the result too."""
    table_id, a, b = await api.table_for_two({"hollywood": True, "target": 25})
    start = await api.view(table_id)
    assert start["options"]["hollywood"] is True
    assert [g["scores"] for g in start["match"]["games"]] == [[0, 0]] * 3
    final = await play_to_the_end(api, table_id, [a, b], seed=5)
    assert final["status"] == "match_over"
    games = final["match"]["games"]
    assert [g["game"] for g in games] == [1, 2, 3]
    assert all(g["closed"] and g["tally"] is not None for g in games)
    result = final["match"]["result"]
    assert result["reason"] == "target"
    assert [g["winner"] for g in games].count(result["winner"]) >= 2
    assert result["games"] == games
    for seat in (0, 1):
        assert result["tally"][seat]["total"] == sum(g["tally"][seat]["total"] for g in games)
    assert final["match"]["last_hand"]["games"] == games  # the hand that closed game 3


async def test_r9_6_a_plain_table_has_no_columns(api: Api) -> None:
    table_id, _, _ = await api.table_for_two({"target": 25})
    view = await api.view(table_id)
    assert view["options"]["hollywood"] is False
    assert "games" not in view["match"]
