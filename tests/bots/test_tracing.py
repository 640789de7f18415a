"""Traces (issue 34, part 1): one trace from a person's move to the bot's answer, through the
real table service and bot worker against real PostgreSQL and RabbitMQ; log lines carry the
trace; off by default, with no provider installed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind

from services.bots.app import create_app as create_worker_app
from services.bots.strategies import STRATEGIES
from services.table.app import create_app as create_table
from shared.infra import tracing
from shared.infra.settings import Settings
from tests.bots.test_worker import LEVEL, bot_table, persons_turn, purge, wait_for
from tests.e2e.processes import ROOT
from tests.table.conftest import Api, Clock, SeededShuffle, connection, serving


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, every trace kept, each span in memory once it ends."""
    exporter = InMemorySpanExporter()
    tracing.start("test", exporter=exporter, sampler=ALWAYS_ON)
    try:
        yield exporter
    finally:
        tracing.stop()
    assert tracing.provider() is None


@pytest.fixture
async def traced_api(spans: InMemorySpanExporter, settings: Settings) -> AsyncIterator[Api]:
    """The table service and a bot worker of one level, in this process, tracing."""
    table = create_table(settings, clock=Clock(), shuffle=SeededShuffle(7))
    worker = create_worker_app(settings, {LEVEL: STRATEGIES[LEVEL]})
    async with serving(table) as client, serving(worker):
        yield Api(client, settings)


def plain_move(view: dict[str, Any]) -> dict[str, Any]:
    """The scripted person's move (``sobra_move``) but never a knock: the hand goes on, and
    the bot has the next turn."""
    hint = view["hand"]["my_arrangement"].get("discard")
    if hint:
        return {"type": "discard", "card": hint}
    move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
    return {"type": "draw", "source": "stock"} if move["type"] == "draw" else dict(move)


def _trace_of(found: list[ReadableSpan], span: ReadableSpan) -> list[ReadableSpan]:
    assert span.context is not None
    return [
        s for s in found if s.context is not None and s.context.trace_id == span.context.trace_id
    ]


def _descendants(of: ReadableSpan, among: list[ReadableSpan]) -> list[ReadableSpan]:
    found, todo = [], [of]
    while todo:
        children = _children(todo.pop(), among)
        found += children
        todo += children
    return found


def _children(of: ReadableSpan, among: list[ReadableSpan]) -> list[ReadableSpan]:
    assert of.context is not None
    return [s for s in among if s.parent is not None and s.parent.span_id == of.context.span_id]


async def test_a_persons_move_and_the_bots_answer_are_one_trace(
    traced_api: Api, spans: InMemorySpanExporter, settings: Settings
) -> None:
    api = traced_api
    await purge(settings)
    table_id, token = await bot_table(api)
    spans.clear()  # the table's creation and seating: traces of their own
    # The person moves (draws, then discards: the bot's turn) until the bot answers.
    view = await wait_for(api, table_id, token, persons_turn)
    while True:
        move = plain_move(view)
        status, body = await api.command(table_id, token, **move)
        assert status == 200, body
        view = await wait_for(api, table_id, token, persons_turn)
        if view["version"] > body["version"]:
            break  # the bot moved
    async with asyncio.timeout(10):  # the bot's command's handling ends after its commit
        while not any(s.name == "table_commands process" for s in spans.get_finished_spans()):
            await asyncio.sleep(0.05)

    found = list(spans.get_finished_spans())
    moves = [
        s for s in found if s.kind == SpanKind.SERVER and s.name == "POST /v1/tables/{id}/commands"
    ]
    move = next(
        m for m in moves if any(s.name == "table_commands process" for s in _trace_of(found, m))
    )
    assert move.parent is None  # the move starts the trace
    one = _trace_of(found, move)
    # The move's statements: the save of its change, with its outbox rows (in a group
    # commit's span, or in the move's own transaction).
    statements = [s for s in _descendants(move, one) if s.kind == SpanKind.CLIENT]
    assert all(s.attributes and s.attributes["db.system.name"] == "postgresql" for s in statements)
    assert any(s.name == "WITH" for s in statements), [s.name for s in statements]
    # The relay's publish of the bot's turn (the outbox row kept the move's traceparent).
    publishes = [s for s in one if s.kind == SpanKind.PRODUCER and s.name.endswith("bots publish")]
    assert publishes
    assert any(p.parent is not None and p.parent.span_id == move.context.span_id for p in publishes)
    # The bot worker's handling of its turn, a child of that publish (the AMQP header).
    turns = [s for s in one if s.name == "bot_turns process"]
    assert turns
    turn = turns[0]
    assert turn.kind == SpanKind.CONSUMER
    assert turn.parent is not None
    assert turn.parent.span_id in {p.context.span_id for p in publishes if p.context}
    # The table's handling of the bot's command, a child of the bot's turn (its command's
    # header), with the statements that saved the bot's move.
    answers = [s for s in one if s.name == "table_commands process"]
    assert answers
    assert answers[0].parent is not None
    assert answers[0].parent.span_id in {t.context.span_id for t in turns if t.context}
    assert any(s.kind == SpanKind.CLIENT for s in _children(answers[0], one))
    # Every span of the trace is connected: each parent is in it.
    ids = {s.context.span_id for s in one if s.context}
    assert all(s.parent is None or s.parent.span_id in ids for s in one), [s.name for s in one]


async def test_a_traced_outbox_row_keeps_its_traceparent(
    traced_api: Api, spans: InMemorySpanExporter, settings: Settings
) -> None:
    api = traced_api
    created = await api.create(api.token("Ana"))
    move = next(s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER)
    parents = await outbox_parents(settings, created["table_id"])
    assert parents
    assert move.context is not None
    assert {p["traceparent"].split("-")[1] for p in parents} == {f"{move.context.trace_id:032x}"}


async def test_each_websocket_command_is_a_trace_of_its_own(
    traced_api: Api, spans: InMemorySpanExporter
) -> None:
    api = traced_api
    table_id, ana, _ = await api.table_for_two()
    spans.clear()
    async with api.client.ws_connect(f"/v1/tables/{table_id}/ws?token={ana}") as ws:
        await ws.receive_json()  # the snapshot
        for n in range(2):
            command = {"type": "draw", "source": "stock", "command_id": f"ws-{n}"}
            await ws.send_json({"kind": "command", "command": command})
            await ws.receive_json()  # its result, or its refusal
    found = spans.get_finished_spans()
    commands = [s for s in found if s.name == "WS command"]
    assert len(commands) == 2
    assert all(c.parent is None and c.kind == SpanKind.SERVER for c in commands)
    assert commands[0].context.trace_id != commands[1].context.trace_id
    assert not [s for s in found if s.name.endswith("/ws")]  # the socket's life: no span


async def outbox_parents(settings: Settings, table_id: str) -> list[asyncpg.Record]:
    """The ``traceparent`` of each outbox row of a table's events."""
    async with connection(settings) as conn:
        return await conn.fetch(
            "SELECT traceparent FROM outbox WHERE routing_key LIKE $1", f"table.{table_id}.%"
        )


LOG_IN_A_SPAN = """
import json, structlog
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from shared.infra import tracing
from shared.infra.logs import configure
configure("json", "info", service="table")
structlog.get_logger().info("before")
tracing.start("table", exporter=InMemorySpanExporter())
with tracing.handling("bot_turns", None):
    structlog.get_logger().info("inside")
    import logging; logging.getLogger("aiormq").warning("a library's line")
    print(json.dumps({"expected": tracing.ids()}))
structlog.get_logger().info("after")
tracing.stop()
"""


def test_log_lines_carry_the_trace_of_their_span() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOG_IN_A_SPAN], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    trace_id, span_id = next(line["expected"] for line in lines if "expected" in line)
    by_event = {line.get("event"): line for line in lines}
    for event in ("inside", "a library's line"):
        assert by_event[event]["trace_id"] == trace_id
        assert by_event[event]["span_id"] == span_id
    assert "trace_id" not in by_event["before"]
    assert "trace_id" not in by_event["after"]


async def test_tracing_is_off_by_default_and_installs_no_provider(
    api: Api, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.configured() is None
    created = await api.create(api.token("Ana"))  # the table service is up, not tracing
    assert tracing.provider() is None
    assert not isinstance(trace.get_tracer_provider(), SdkTracerProvider)
    assert tracing.traceparent() is None
    assert tracing.headers() is None
    parents = await outbox_parents(settings, created["table_id"])
    assert parents
    assert all(p["traceparent"] is None for p in parents)


async def test_the_environment_turns_tracing_on_for_the_apps_life(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.configured() is None  # the SDK disabled wins
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    assert tracing.configured() == "console"
    app = web.Application()
    ctx = tracing.traced("bots")(app)
    await anext(ctx)
    assert tracing.provider() is not None
    with pytest.raises(StopAsyncIteration):
        await anext(ctx)
    assert tracing.provider() is None  # shut down (flushed) at cleanup
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ValueError, match="zipkin"):
        tracing.configured()
