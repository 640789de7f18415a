"""Traces (OpenTelemetry): a move followed from its request to the bot's answer.

Off unless ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``: HTTP/protobuf to
``OTEL_EXPORTER_OTLP_ENDPOINT``; ``console``) and ``OTEL_SDK_DISABLED`` is not ``true``. Off,
no SDK provider is installed and every helper here returns at its first check: no span, no
header, the outbox's ``traceparent`` left NULL. On, the SDK reads the standard ``OTEL_*``
variables itself: sampling (``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``;
parent-based, so a trace is kept or dropped whole), the exporter's endpoint, headers and
timeout, the batch processor's queue, the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``).

The spans are our own, thin, where the work is (docs/DESIGN.md, "Traces"): a request's
(``middleware``), its statements' (``trace_statements``, asyncpg's query logger), an outbox
row's publish (``publishing``: the row keeps the ``traceparent`` of the work that wrote it,
and the message carries the publish span's), a message's handling (``handling``, from its
``traceparent`` header), and a bot's command back (``headers``).

The provider is the process's, opened by the first app that starts (``traced``, a cleanup
context) and shut down, its spans flushed, when the last one stops. It is not made the
global provider: a process (a test) may open and close it again.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import asyncpg
from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

EXPORTERS = ("otlp", "console")  # OTEL_TRACES_EXPORTER's values that turn tracing on
# The OTEL_* variables the manifests set (deploy/k8s/base/settings.env): the switch, the
# sampling and the collector the SDK reads once it is on.
ENV_NAMES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)
_propagator = TraceContextTextMapPropagator()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# What the span helpers return when tracing is off: one shared do-nothing block, so a move's
# handling pays a check, not a generator's setup and teardown.
_OFF: AbstractContextManager[None] = nullcontext()


class _Process:
    """The process's provider, and how many apps hold it open."""

    provider: TracerProvider | None = None
    tracer: trace.Tracer = trace.NoOpTracer()
    users = 0


_process = _Process()


def on() -> bool:
    """Whether this process traces (a provider is open)."""
    return _process.provider is not None


def provider() -> TracerProvider | None:
    """The process's provider, None when tracing is off."""
    return _process.provider


def configured(environ: Mapping[str, str] | None = None) -> str | None:
    """The exporter the environment asks for, or None: tracing off (the default)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if exporter in ("", "none"):
        return None
    if exporter not in EXPORTERS:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={exporter!r}: this service exports to one of"
            f" {', '.join(EXPORTERS)} (or none)"
        )
    return exporter


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    # Imported only when asked for: requests and protobuf stay out of a process not tracing.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: the OTEL_* variables


def start(
    service: str,
    exporter: SpanExporter | None = None,
    sampler: Sampler | None = None,
    processor: SpanProcessor | None = None,
) -> TracerProvider:
    """Open the process's provider (a second call only counts one more user): spans go to
    ``exporter`` (synchronously: a test's in-memory one) or ``processor``, else to the
    exporter ``OTEL_TRACES_EXPORTER`` names, in batches."""
    if _process.provider is not None:
        _process.users += 1
        return _process.provider
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: f"gin-{service}"}
    made = TracerProvider(sampler=sampler, resource=Resource.create(attributes))
    if processor is None:
        if exporter is not None:
            processor = SimpleSpanProcessor(exporter)
        else:
            name = configured()
            if name is None:
                raise ValueError("tracing is off: OTEL_TRACES_EXPORTER names no exporter")
            processor = BatchSpanProcessor(_exporter(name))
    made.add_span_processor(processor)
    _process.provider, _process.tracer, _process.users = made, made.get_tracer("gin"), 1
    return made


def stop() -> None:
    """One user less; the last shuts the provider down, exporting the spans still queued."""
    if _process.provider is None:
        return
    _process.users -= 1
    if _process.users > 0:
        return
    made, _process.provider, _process.tracer = _process.provider, None, trace.NoOpTracer()
    made.shutdown()


def traced(service: str) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context: tracing on for the app's life when the environment asks for it."""

    async def ctx(_: web.Application) -> AsyncIterator[None]:
        wanted = configured() is not None
        if wanted:
            start(service)
        try:
            yield
        finally:
            if wanted:
                stop()

    return ctx


# --- the context, carried -----------------------------------------------------------------


def traceparent() -> str | None:
    """The current span's W3C ``traceparent``, None when there is none (tracing off)."""
    found = _current()
    return None if found is None else _traceparent_of(found)


def _current() -> SpanContext | None:
    """The current span's context, None when tracing is off or no span is current."""
    if _process.provider is None:
        return None
    found = trace.get_current_span().get_span_context()
    return found if found.is_valid else None


def _traceparent_of(found: SpanContext) -> str:
    return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"


def headers() -> dict[str, Any] | None:
    """AMQP headers carrying the current span (a bot's command), None when there is none."""
    parent = traceparent()
    return None if parent is None else {"traceparent": parent}


def _dropped(parent: str) -> bool:
    """Whether a ``traceparent`` says its trace is not sampled (its flags' low bit)."""
    try:
        return not int(parent[-2:], 16) & 1
    except ValueError:
        return False


def _context_of(parent: object) -> otel_context.Context | None:
    if not isinstance(parent, str | bytes):
        return None
    text = parent.decode("ascii", "replace") if isinstance(parent, bytes) else parent
    return _propagator.extract({"traceparent": text})


def ids() -> tuple[str, str] | None:
    """The current span's trace and span ids (hex), for a log line; None when none."""
    found = _current()
    return None if found is None else (f"{found.trace_id:032x}", f"{found.span_id:016x}")


# --- the spans --------------------------------------------------------------------------------


def span(
    name: str,
    attributes: Mapping[str, int | str] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> AbstractContextManager[None]:
    """A span current for the block (a new trace when none is current): work that starts
    on its own (a timer's firing, a bot turn sent again), a WebSocket's command."""
    if _process.provider is None:
        return _OFF
    return _span(name, attributes, kind)


@contextmanager
def _span(name: str, attributes: Mapping[str, int | str] | None, kind: SpanKind) -> Iterator[None]:
    with _process.tracer.start_as_current_span(name, attributes=attributes, kind=kind):
        yield


def on_behalf_of(name: str, parents: Sequence[str | None]) -> AbstractContextManager[None]:
    """A span current for work done at once for several traced callers (the group commit's
    statement, its changes' many commands): a child of the first sampled caller's span
    (else the first's), linked to each of theirs. Not the span current where the work
    began: that is whichever caller happened to start it."""
    if _process.provider is None:
        return _OFF
    return _on_behalf_of(name, parents)


@contextmanager
def _on_behalf_of(name: str, parents: Sequence[str | None]) -> Iterator[None]:
    traced = [p for p in parents if p is not None]
    first = next((p for p in traced if not _dropped(p)), traced[0] if traced else None)
    links = [Link(trace.get_current_span(_context_of(p)).get_span_context()) for p in traced]
    with _process.tracer.start_as_current_span(
        name,
        context=_context_of(first) or otel_context.Context(),
        links=links,
        attributes={"gin.callers": len(parents)},
    ):
        yield


def handling(
    name: str, message_headers: Mapping[str, object] | None
) -> AbstractContextManager[None]:
    """A consumed message's span (its ``traceparent`` header the parent), current for the
    block: its work, what that work writes to the outbox and sends."""
    if _process.provider is None:
        return _OFF
    return _handling(name, message_headers)


@contextmanager
def _handling(name: str, message_headers: Mapping[str, object] | None) -> Iterator[None]:
    # A message without one starts a trace of its own.
    parent = _context_of((message_headers or {}).get("traceparent")) or otel_context.Context()
    remote = trace.get_current_span(parent).get_span_context()
    if remote.is_valid and not remote.trace_flags.sampled:
        # Dropped upstream: no span would be kept; the decision is carried on as it came
        # (what this work writes and sends keeps it), at no span's cost.
        token = otel_context.attach(parent)
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    with _process.tracer.start_as_current_span(
        f"{name} process", context=parent, kind=SpanKind.CONSUMER
    ):
        yield


def publishing(exchange: str, routing_key: str, parent: str | None) -> Span | None:
    """The span of one outbox row's publish, child of the work that wrote the row (its
    ``traceparent``); None for a row without one, or of a trace not sampled. The caller ends
    it (``published``)."""
    if _process.provider is None or parent is None or _dropped(parent):
        return None
    return _process.tracer.start_span(
        f"{exchange} publish",
        context=_context_of(parent),
        kind=SpanKind.PRODUCER,
        attributes={"messaging.system": "rabbitmq", "messaging.rabbitmq.routing_key": routing_key},
    )


def header_of(span: Span | None, parent: str | None) -> dict[str, Any] | None:
    """The AMQP headers of an outbox row's message: its publish span's ``traceparent``, else
    the row's own (a trace not sampled: the decision travels on), else none."""
    if span is None:
        return None if parent is None else {"traceparent": parent}
    return {"traceparent": _traceparent_of(span.get_span_context())}


def published(spans: Sequence[Span | None], error: BaseException | None = None) -> None:
    """End publish spans: confirmed, or failed with ``error``."""
    for span in spans:
        if span is None:
            continue
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, repr(error)))
        span.end()


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request's span (a new trace: a public client does not choose what is sampled), named
    by its route, current while it is handled. A WebSocket gets none (it would hold every
    command of its life in one trace): each of its commands gets its own (``span``)."""
    if _process.provider is None or request.headers.get("Upgrade", "").lower() == "websocket":
        return await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    with _process.tracer.start_as_current_span(
        f"{request.method} {route}",
        context=otel_context.Context(),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": request.method, "http.route": route},
    ) as span:
        response = await handler(request)
        span.set_attribute("http.response.status_code", response.status)
        if response.status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        return response


async def trace_statements(conn: asyncpg.Connection) -> None:
    """A pool's ``init``: give a connection's statements spans, each a child of the span
    current when it ran (none without one). asyncpg's query logger calls back once the
    statement is done, in the context it ran in; the span is made then, with its times."""
    if _process.provider is not None:
        conn.add_query_logger(_statement_done)


def _statement_done(record: Any) -> None:
    # Sampled, not recording: the statement may have been the request's last, its span
    # ended by the time this runs.
    if _process.provider is None:
        return
    if not trace.get_current_span().get_span_context().trace_flags.sampled:
        return
    end = time.time_ns()
    query: str = record.query
    span = _process.tracer.start_span(
        _operation(query),
        kind=SpanKind.CLIENT,
        start_time=end - int(record.elapsed * 1e9),
        attributes={"db.system.name": "postgresql", "db.query.text": query},
    )
    if record.exception is not None:
        span.set_status(Status(StatusCode.ERROR, type(record.exception).__name__))
    span.end(end_time=end)


def _operation(query: str) -> str:
    """A statement's span name: its first keyword (``WITH`` for the table's save)."""
    words = query.split(None, 1)
    return words[0].rstrip(";").upper() if words else "SQL"
