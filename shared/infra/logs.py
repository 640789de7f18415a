"""structlog setup: contextvars first (table_id, command_id), JSON in production.

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
from types import TracebackType

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

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
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if service is not None:
        shared.append(_add_service(service))
    structlog.configure(
        processors=[
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
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
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
    root.addHandler(handler)
    root.setLevel(level_no)
    for name in QUIET_AT_INFO:
        logging.getLogger(name).setLevel(max(level_no, logging.WARNING))
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught


def _add_service(service: str) -> Processor:
    def add_service(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("service", service)
        return event_dict

    return add_service


def _log_uncaught(
    kind: type[BaseException], exc: BaseException, traceback: TracebackType | None
) -> None:
    """The process ends on this exception: its traceback as one log line, not plain text."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, traceback)
        return
    structlog.get_logger().critical("uncaught_exception", exc_info=(kind, exc, traceback))
