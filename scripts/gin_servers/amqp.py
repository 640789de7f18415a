"""Whether a RabbitMQ broker answers, learned by logging in to it with aio-pika.

A broker answers when a client can open an AMQP 0-9-1 connection to it; aio-pika (the
services' own client) does the talking. It is imported only when a broker is asked about, so
``servers.py stop`` runs on the standard library alone; the probe runs on an event loop of its
own (on a thread of its own when the caller's thread already runs one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import re
import threading
from collections.abc import Coroutine, Iterator
from types import ModuleType
from typing import Any
from urllib.parse import unquote, urlsplit

from gin_servers.common import LOCALHOST, ServerError, log, redact, tcp_open

AMQP_STANDARD_PORT = 5672
AMQPS_STANDARD_PORT = 5671


class _ThisThread(logging.Filter):
    """Drops the records a probe's own thread logs (aiormq logs a refused connection as an
    error: a probe expects refusals, and its caller says what they mean)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextlib.contextmanager
def _quiet_client() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in ("aiormq.connection", "aio_pika.connection")]
    quiet = _ThisThread()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


def _run_probe(probe: Coroutine[Any, Any, None]) -> None:
    def on_own_loop() -> None:
        with _quiet_client():
            asyncio.run(probe)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        on_own_loop()
        return
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="amqp-probe") as pool:
        pool.submit(on_own_loop).result()


async def _open_and_close(url: str, seconds: float) -> None:
    import aio_pika

    async with asyncio.timeout(seconds):
        connection = await aio_pika.connect(url)
        await connection.close()


def _client_errors() -> ModuleType:
    """aiormq's exceptions (aio-pika's own), or a clear error when the client is missing."""
    try:
        import aio_pika  # noqa: F401
        from aiormq import exceptions
    except ImportError as exc:
        raise ServerError(
            "aio-pika is missing: run this script with the project's venv (.venv/bin/python)"
        ) from exc
    return exceptions


def _refused_in_amqp(exc: BaseException) -> bool:
    """True when the broker spoke AMQP and refused the login or the vhost (it answers)."""
    exceptions = _client_errors()
    if isinstance(exc, exceptions.AuthenticationError | exceptions.ConnectionClosed):
        return True
    # A refused vhost: aiormq reports the Connection.Close it got for Connection.Open-Ok.
    return isinstance(exc, exceptions.InvalidFrameError) and "Connection.Close" in str(exc)


def amqp_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when host:port speaks AMQP 0-9-1: a login as guest succeeds, or the broker refuses
    it in AMQP (another user's broker answers too)."""
    if not tcp_open(host, port, timeout=timeout):
        return False
    _client_errors()
    try:
        _run_probe(_open_and_close(f"amqp://guest:guest@{host}:{port}/", timeout))
    except Exception as exc:
        return _refused_in_amqp(exc)
    return True


def _endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ServerError(f"{redact(url)} is not an amqp:// URL")
    standard = AMQPS_STANDARD_PORT if parts.scheme == "amqps" else AMQP_STANDARD_PORT
    try:
        return parts.hostname or LOCALHOST, parts.port or standard
    except ValueError as exc:
        raise ServerError(f"{redact(url)} has an invalid port") from exc


def _vhost(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if path not in ("", "/") else "/"


def amqp_login(url: str, timeout: float = 10.0) -> None:
    """Open and close an AMQP connection with the URL's credentials and vhost, or raise."""
    exceptions = _client_errors()
    host, port = _endpoint(url)
    user = unquote(urlsplit(url).username or "guest")
    try:
        _run_probe(_open_and_close(url, timeout))
    except exceptions.ProbableAuthenticationError as exc:
        reason = str(exc.args[0] if exc.args else exc).rstrip(".")
        raise ServerError(f"login as {user} refused: {reason}") from exc
    except exceptions.ConnectionClosed as exc:
        raise ServerError(f"the broker closed the connection: {exc}") from exc
    except exceptions.InvalidFrameError as exc:
        if _refused_in_amqp(exc):
            raise ServerError(f"vhost {_vhost(url)!r} refused to {user}") from exc
        raise ServerError(f"{host}:{port} does not speak AMQP 0-9-1: {exc}") from exc
    except TimeoutError as exc:
        raise ServerError(f"AMQP login as {user} on {host}:{port} timed out") from exc
    except (ConnectionError, exceptions.AMQPError) as exc:
        raise ServerError(f"AMQP login as {user} on {host}:{port} failed: {exc}") from exc
    except OSError as exc:
        raise ServerError(f"cannot connect to {host}:{port}: {exc}") from exc


def amqp_node_urls(url: str) -> list[str]:
    """Each node's URL of a broker URL naming several (``amqp://u:p@h1:5672,h2:5673/vhost``,
    as ``shared.infra.amqp.node_urls`` reads GIN_AMQP_URL); the URL itself naming one."""
    parts = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*://)([^@/?#]*@)?([^/?#]*)(.*)", url, re.DOTALL)
    if parts is None or "," not in parts[3]:
        return [url]
    return [parts[1] + (parts[2] or "") + host.strip() + parts[4] for host in parts[3].split(",")]


def amqp_ready(url: str) -> tuple[bool, str]:
    """Whether the broker answers a login (with several nodes named: any of them)."""
    nodes = amqp_node_urls(url)
    if len(nodes) > 1:
        whys = []
        for node in nodes:
            ok, why = amqp_ready(node)
            if ok:
                return True, f"{why} ({redact(node)})"
            whys.append(why)
        return False, "; ".join(whys)
    host, port = _endpoint(url)
    _client_errors()  # a missing client is the caller's error, not the broker's
    if not tcp_open(host, port, timeout=3.0):
        return False, f"nothing accepts TCP connections on {host}:{port}"
    if urlsplit(url).scheme == "amqps":
        return True, "TCP connect ok (TLS not checked further)"
    try:
        amqp_login(url)
    except ServerError as exc:
        return False, str(exc)
    return True, "AMQP login ok"


def standard_amqp_url() -> str | None:
    """The broker on 127.0.0.1:5672 when guest/guest can log in to it."""
    url = f"amqp://guest:guest@{LOCALHOST}:{AMQP_STANDARD_PORT}/"
    if not tcp_open(LOCALHOST, AMQP_STANDARD_PORT):
        return None
    ok, why = amqp_ready(url)
    if not ok:
        log(f"rabbitmq: port {AMQP_STANDARD_PORT} answers but {why}")
        return None
    return url
