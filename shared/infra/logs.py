"""structlog setup: contextvars first (table_id, command_id), JSON in production.

A line written while a span is current carries its ``trace_id`` and ``span_id`` (tracing on:
``shared.infra.tracing``), to find a trace's lines and a line's trace.

With the JSON format every line a service writes is one JSON object: structlog's own lines,
and everything that goes through the standard library's ``logging`` (aiohttp's access and
error logs, aio-pika's, aiormq's and asyncpg's warnings and tracebacks, asyncio's "exception
was never retrieved", Python's warnings) is rendered by the same processors
(``structlog.stdlib.ProcessorFormatter``), with the service's name, the request's or
message's context and any traceback as a field. An exception that would end the process
with a plain-text traceback is logged the same way first.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from types import TracebackType

import structlog
from aiohttp.http_exceptions import HttpProcessingError
from structlog.typing import EventDict, Processor, WrappedLogger

from shared.infra import tracing

LINES_PER_S = 10  # of one event at warning or above; the rest are counted, not written


class Throttle:
    """At most ``per_s`` lines a second of any one event at warning or above: an outage makes
    every request and every retry say the same thing, over and over while it lasts, which
    buries the lines that differ. The next line of that event that passes
    carries ``suppressed``, how many were dropped since the last one."""

    def __init__(self, per_s: int = LINES_PER_S, clock: Callable[[], float] = time.monotonic):
        self.per_s = per_s
        self.clock = clock
        self.seen: dict[str, tuple[int, int, int]] = {}  # key: (second, passed, dropped)

    def passes(self, key: str) -> tuple[bool, int]:
        """Whether a line of this event may be written now, and how many were dropped
        before it (0 when it may not)."""
        second = int(self.clock())
        window, passed, dropped = self.seen.get(key, (second, 0, 0))
        if window != second:
            window, passed = second, 0
        if passed >= self.per_s:
            self.seen[key] = (window, passed, dropped + 1)
            return False, 0
        if len(self.seen) > 10_000:  # library messages vary: keep the memory bounded
            self.seen.clear()
        self.seen[key] = (window, passed + 1, 0)
        return True, dropped

    def processor(self, _: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
        """A structlog processor: drop the line (``DropEvent``) past the rate."""
        if method not in ("warning", "error", "critical", "exception"):
            return event_dict
        ok, dropped = self.passes(str(event_dict.get("event", ""))[:100])
        if not ok:
            raise structlog.DropEvent
        if dropped:
            event_dict["suppressed"] = dropped
        return event_dict

    def filter(self, record: logging.LogRecord) -> bool:
        """A logging filter (the libraries' records): the same rate, by logger and message."""
        if record.levelno < logging.WARNING:
            return True
        ok, dropped = self.passes(f"{record.name}:{str(record.msg)[:100]}")
        if ok and dropped:
            record.suppressed = dropped
        return ok


class MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse (a bad request line, header or chunk: an
    ``HttpProcessingError``, answered 400 and closed) at ERROR with its traceback: log volume
    an anonymous client controls, and no error of ours. This filter, on aiohttp's server
    logger, writes it instead as one INFO line, ``request_malformed`` with the address and
    the parser's reason and no traceback, at most once per ``every_s`` per address (the next
    says how many were dropped: ``suppressed``). Every other record passes unchanged."""

    def __init__(
        self,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        addresses: int = 10_000,
    ) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self.addresses = addresses  # remembered at most; past it, forgotten all at once
        self.last: dict[str, tuple[float, int]] = {}  # address: (last written, dropped since)

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite (or drop) a malformed request's record; pass every other."""
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        if not logging.getLogger().isEnabledFor(logging.INFO):
            return False
        address = str(record.args[0]) if isinstance(record.args, tuple) and record.args else "?"
        now = self.clock()
        written, dropped = self.last.get(address, (-self.every_s, 0))
        if now - written < self.every_s:
            self.last[address] = (written, dropped + 1)
            return False
        if len(self.last) >= self.addresses:
            self.last.clear()
        self.last[address] = (now, 0)
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = "request_malformed", ()
        record.exc_info, record.exc_text = None, None
        record.fields = {
            "remote": address,
            "status": exc.code or 400,
            "reason": str(exc.message)[:200],
            **({"suppressed": dropped} if dropped else {}),
        }
        return True


# Libraries chatty at INFO about what our own logs say better (one line per reconnection
# attempt, per channel): their warnings and errors still come through.
QUIET_AT_INFO = ("aio_pika", "aiormq")


def configure(log_format: str = "json", level: str = "info", service: str | None = None) -> None:
    """Configure structlog and the standard library's logging for a service process."""
    level_no = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if service is not None:
        shared.append(_add_service(service))
    throttle = Throttle()
    structlog.configure(
        processors=[
            throttle.processor,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, _add_suppressed],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler.addFilter(throttle.filter)
    root.addHandler(handler)
    root.setLevel(level_no)
    for name in QUIET_AT_INFO:
        logging.getLogger(name).setLevel(max(level_no, logging.WARNING))
    server = logging.getLogger("aiohttp.server")
    for old_filter in [f for f in server.filters if isinstance(f, MalformedRequests)]:
        server.removeFilter(old_filter)
    server.addFilter(MalformedRequests())
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught


def add_trace_ids(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """The current span's ``trace_id`` and ``span_id``, when tracing is on and one is."""
    found = tracing.ids()
    if found is not None:
        event_dict["trace_id"], event_dict["span_id"] = found
    return event_dict


def _add_service(service: str) -> Processor:
    def add_service(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("service", service)
        return event_dict

    return add_service


def _add_suppressed(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    record = event_dict.get("_record")
    suppressed = getattr(record, "suppressed", None)
    if suppressed:
        event_dict["suppressed"] = suppressed
    event_dict.update(getattr(record, "fields", None) or {})  # MalformedRequests' fields
    return event_dict


def _log_uncaught(
    kind: type[BaseException], exc: BaseException, traceback: TracebackType | None
) -> None:
    """The process ends on this exception: its traceback as one log line, not plain text."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, traceback)
        return
    structlog.get_logger().critical("uncaught_exception", exc_info=(kind, exc, traceback))
