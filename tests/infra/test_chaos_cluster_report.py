"""make chaos-cluster's report (chaos/verdict.py, chaos/cluster.py) counts what it says: an
event id with two bodies is caught wherever they were seen and however the JSON was spelled,
latency windows and the worst one after a fault hold, and any non-zero count fails the run."""

from __future__ import annotations

import asyncio
import doctest
import json
import uuid

import pytest

import chaos.cluster
import chaos.verdict
from chaos.cluster import through_proxy
from chaos.proxy import CutProxy
from chaos.verdict import (
    MUST_BE_ZERO,
    canonical,
    event_id,
    failed,
    reused_ids,
    windows,
    worst_after,
)


def envelope(seq: int, card: str, *, occurred_at: str = "2026-12-03T18:02:39.114Z") -> dict:
    return {
        "id": str(uuid.UUID(int=seq)),
        "type": "card_discarded",
        "table_id": "T1",
        "stream": "table",
        "seq": seq,
        "version": seq,
        "occurred_at": occurred_at,
        "schema_version": 1,
        "data": {"type": "card_discarded", "hand": 1, "seat": 0, "card": card},
    }


def test_the_examples_of_the_report_hold() -> None:
    for module in (chaos.verdict, chaos.cluster):
        failed_count, attempted = doctest.testmod(module)
        assert attempted >= 2
        assert failed_count == 0


def test_the_same_event_spelled_differently_is_no_reuse() -> None:
    log = json.dumps(envelope(7, "Ks"), sort_keys=True)  # jsonb's order
    stream = json.dumps(envelope(7, "Ks"))
    socket = json.dumps({**envelope(7, "Ks"), "occurred_at": "2026-12-03T18:02:39.114000+00:00"})
    key = event_id(envelope(7, "Ks"))
    assert (
        reused_ids([(key, canonical(log)), (key, canonical(stream)), (key, canonical(socket))])
        == {}
    )


def test_a_seq_handed_out_twice_is_caught_across_sources() -> None:
    # what an asynchronous standby's promotion does: the lost commit's seq goes to another
    first = envelope(7, "Ks")
    second = {**envelope(7, "2c"), "id": str(uuid.uuid4())}
    seen = [
        (event_id(first), canonical(json.dumps(first))),  # the history stream, before the crash
        (event_id(second), canonical(json.dumps(second))),  # the new primary's log
        (event_id(envelope(8, "3d")), canonical(json.dumps(envelope(8, "3d")))),
    ]
    assert reused_ids(seen) == {("table", "T1", 7): 2}


def test_positions_of_different_streams_are_different_ids() -> None:
    chat = {**envelope(7, "Ks"), "stream": "chat", "type": "x", "data": {"type": "x"}}
    assert event_id(chat) != event_id(envelope(7, "Ks"))
    old = {k: v for k, v in envelope(7, "Ks").items() if k != "stream"}
    assert event_id(old) == ("table", "T1", 7)


def test_windows_and_the_worst_one_after_each_fault() -> None:
    samples = [(t * 0.5, 0.01) for t in range(120)]  # 60 s at 10 ms
    samples += [(31.0, 4.0), (47.0, 1.5)]  # a failover at 30 s
    by_window = windows(samples, 10.0)
    assert [w["start_s"] for w in by_window] == [0, 10, 20, 30, 40, 50]
    assert by_window[3]["p99_ms"] == 4000.0
    assert worst_after(by_window, 30.0)["start_s"] == 30
    assert worst_after(by_window, 42.0)["p99_ms"] == 1500.0  # the window it falls in counts
    assert worst_after(by_window, 55.0)["p99_ms"] == 10.0
    assert worst_after(by_window, 61.0) is None


@pytest.mark.parametrize("count", MUST_BE_ZERO)
def test_each_count_fails_the_run(count: str) -> None:
    zeros = dict.fromkeys(MUST_BE_ZERO, 0)
    assert failed(zeros) == []
    assert failed({**zeros, count: 1}) == [count]
    assert failed({k: v for k, v in zeros.items() if k != count}) == [count]


def test_503s_are_expected_500s_are_not() -> None:
    zeros = dict.fromkeys(MUST_BE_ZERO, 0)
    assert failed({**zeros, "http_5xx": 250}) == []
    assert "http_500" in MUST_BE_ZERO


def test_table_b_reaches_each_node_through_its_proxy() -> None:
    url = "postgresql://postgres@127.0.0.1:5001,127.0.0.1:5002/gin?target_session_attrs=read-write"
    moved = through_proxy(url, {5001: 6001, 5002: 6002})
    assert moved.startswith("postgresql://postgres@127.0.0.1:6001,127.0.0.1:6002/gin?")
    with pytest.raises(ValueError, match="5002"):
        through_proxy(url, {5001: 6001})


async def test_the_proxy_forwards_resets_holds_and_forwards_again() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = CutProxy(server.sockets[0].getsockname()[1])
    port = await proxy.start()

    async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        writer.write(b"ping")
        await writer.drain()
        async with asyncio.timeout(1):
            return await reader.read(4)

    try:
        before = await asyncio.open_connection("127.0.0.1", port)
        assert await ask(*before) == b"ping"
        assert proxy.drop() == 2  # both ends of the one pipe
        with pytest.raises(ConnectionResetError):
            await ask(*before)
        held = await asyncio.open_connection("127.0.0.1", port)  # accepted...
        with pytest.raises(TimeoutError):
            await ask(*held)  # ...and never answered
        assert proxy.forward() == 1
        after = await asyncio.open_connection("127.0.0.1", port)
        assert await ask(*after) == b"ping"
        for _, writer in (before, held, after):
            writer.close()
    finally:
        await proxy.stop()
        server.close()
        await server.wait_closed()


def test_a_stall_among_many_quick_answers_shows_in_the_maximum() -> None:
    samples = [(float(t % 10), 0.005) for t in range(300)] + [(9.5, 12.0)]
    (window,) = windows(samples, 10.0)
    assert window["p99_ms"] == 5.0  # 1 in 301: under the 99th percentile
    assert window["max_ms"] == 12000.0
    assert worst_after([window], 3.0, key="max_ms") == window
