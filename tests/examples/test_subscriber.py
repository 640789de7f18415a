"""examples/subscriber.py against the real table service and RabbitMQ (issue 15, part 5): after
matches are played, ``--from-start --idle-exit`` prints every event of their tables' logs, once
each, as published; ``--since`` starts at a moment; ``--turns`` keeps whose turn it is.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from shared.infra.settings import Settings
from tests.table.conftest import Api, all_events, play_to_the_end, published

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "subscriber.py"
IDLE_S = 2


async def subscriber(settings: Settings, *args: str, within_s: float = 60.0) -> list[Any]:
    """Run the example to its idle exit; its stdout as JSON values, one a line."""
    env = {**os.environ, "GIN_AMQP_URL": settings.amqp_url, "GIN_PREFIX": settings.prefix}
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        *args,
        "--idle-exit",
        str(IDLE_S),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(within_s):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert time.monotonic() - started >= IDLE_S  # it waited for nothing new
    assert out.endswith(b"\n") or not out
    return [msgspec.json.decode(line) for line in out.splitlines()]


async def a_match(api: Api, seed: int) -> tuple[str, list[str]]:
    table_id, ana, bia = await api.table_for_two({"target": 10})
    await play_to_the_end(api, table_id, [ana, bia], seed=seed)
    return table_id, [ana, bia]


async def test_from_start_prints_every_event_of_the_played_tables(
    api: Api, db: asyncpg.Connection, settings: Settings
) -> None:
    tables = [(await a_match(api, seed))[0] for seed in (1, 2)]
    waiting = (await api.create(api.token("Caio")))["table_id"]  # one event, no match
    tables.append(waiting)
    logs = {}
    for table_id in tables:
        await published(db, table_id)
        logs[table_id] = await all_events(api, table_id)
    assert sum(len(log) for log in logs.values()) > 50

    printed = await subscriber(settings, "--from-start")
    positions = [(p["stream"], p["table_id"], p["seq"]) for p in printed]
    assert len(positions) == len(set(positions)), "an event printed twice"
    assert len({p["id"] for p in printed}) == len(printed)
    for table_id, log in logs.items():
        mine = [p for p in printed if p["table_id"] == table_id]
        assert mine == log, table_id  # every event, in order, exactly as the log has it


async def test_since_starts_at_a_moment(
    api: Api, db: asyncpg.Connection, settings: Settings
) -> None:
    first, _ = await a_match(api, 3)
    await published(db, first)
    await asyncio.sleep(1.5)
    since = datetime.now(UTC)
    await asyncio.sleep(0.5)
    second, _ = await a_match(api, 4)
    await published(db, second)
    printed = await subscriber(settings, "--since", since.isoformat().replace("+00:00", "Z"))
    assert [p for p in printed if p["table_id"] == second] == await all_events(api, second)
    assert not [p for p in printed if p["table_id"] == first]


async def test_turns_follow_each_player(
    api: Api, db: asyncpg.Connection, settings: Settings
) -> None:
    done, _ = await a_match(api, 5)
    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    view = await api.view(table_id, ana)
    for _ in range(3):  # a few moves of a hand, then it waits on someone
        seat = view["hand"]["to_act"]
        view = await api.view(table_id, tokens[seat])
        move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
        status, body = await api.command(table_id, tokens[seat], **move)
        assert status == 200, body
        view = body["view"]
    await published(db, table_id)
    await published(db, done)
    view = await api.view(table_id)
    to_act = view["hand"]["to_act"]
    player = view["seats"][to_act]["id"]

    printed = await subscriber(settings, "--turns", "--from-start")
    *changes, summary = printed
    assert table_id in summary["waiting_on"][player]
    assert done not in {t for tables in summary["waiting_on"].values() for t in tables}
    mine = [c for c in changes if c["table_id"] == table_id]
    assert mine[-1]["seat"] == to_act
    assert mine[-1]["player"] == player
    assert all(a["seat"] != b["seat"] for a, b in itertools.pairwise(mine))
    assert [c for c in changes if c["table_id"] == done][-1]["seat"] is None  # match over
