"""The tracing helpers on their own (issue 34): work done at once for several traced callers
(the table's group commit) joins the trace that is kept, and links every caller's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

from shared.infra import tracing


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.start("test", exporter=exporter, sampler=ParentBased(ALWAYS_ON))
    try:
        yield exporter
    finally:
        tracing.stop()


def test_a_group_commit_joins_the_sampled_callers_trace_and_links_them_all(
    spans: InMemorySpanExporter,
) -> None:
    kept = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03"  # sampled, random
    dropped = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-02"  # random only
    with tracing.on_behalf_of("group commit", [dropped, None, kept]):
        assert tracing.traceparent() is not None
    (span,) = spans.get_finished_spans()
    assert span.parent is not None
    assert f"{span.parent.trace_id:032x}" == kept.split("-")[1]
    assert f"{span.parent.span_id:016x}" == kept.split("-")[2]
    assert {f"{link.context.trace_id:032x}" for link in span.links} == {
        kept.split("-")[1],
        dropped.split("-")[1],
    }
    assert span.attributes is not None
    assert span.attributes["gin.callers"] == 3


def test_callers_none_of_them_sampled_record_nothing(spans: InMemorySpanExporter) -> None:
    dropped = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00"
    with tracing.on_behalf_of("group commit", [dropped]):
        parent = tracing.traceparent()
    assert parent is not None
    assert parent.endswith("-00")  # the decision travels on: the bot's answer is dropped too
    assert spans.get_finished_spans() == ()


def test_the_provider_is_the_processs_open_while_an_app_uses_it() -> None:
    exporter = InMemorySpanExporter()
    tracing.start("test", exporter=exporter, sampler=ALWAYS_OFF)
    try:
        assert tracing.start("again") is tracing.provider()  # one provider per process
        tracing.stop()
        assert tracing.provider() is not None  # still one user
        with tracing.on_behalf_of("group commit", [None, None]):
            pass
    finally:
        tracing.stop()
    assert tracing.provider() is None
    assert exporter.get_finished_spans() == ()


def test_a_statement_span_is_named_by_its_first_keyword() -> None:
    assert tracing._operation("BEGIN;") == "BEGIN"
    assert tracing._operation("\n  with x AS (SELECT 1) SELECT * FROM x") == "WITH"
    assert tracing._operation("") == "SQL"


def test_a_message_of_a_dropped_trace_carries_the_decision_on_without_a_span(
    spans: InMemorySpanExporter,
) -> None:
    dropped = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00"
    with tracing.handling("bot_turns", {"traceparent": dropped}):
        assert tracing.traceparent() == dropped  # the bot's command says "not sampled" too
    assert tracing.publishing("gin.bots", "bot.luna", dropped) is None
    assert tracing.header_of(None, dropped) == {"traceparent": dropped}
    assert tracing.header_of(None, None) is None
    assert spans.get_finished_spans() == ()


def test_a_message_of_a_kept_trace_is_handled_in_a_span_of_that_trace(
    spans: InMemorySpanExporter,
) -> None:
    kept = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracing.handling("bot_turns", {"traceparent": kept.encode()}):
        inside = tracing.traceparent()
    (span,) = spans.get_finished_spans()
    assert span.name == "bot_turns process"
    assert inside is not None
    assert inside.split("-")[1] == kept.split("-")[1]
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == kept.split("-")[2]
