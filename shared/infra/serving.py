"""How every service is served: aiohttp's, plus a deadline on each request's head.

A client that sends a request line and then its headers slowly, or part of them and then
nothing (slowloris), is held by aiohttp until its keep-alive timer, then dropped without an
answer; aiohttp has no setting for a head deadline. ``HeadDeadline`` starts a timer when the
first bytes of a request's head arrive and stops it once the head is parsed; if it fires
first, the client gets ``408 request_timeout`` (the one error shape, as for a body past
``GIN_BODY_READ_S``) and the connection is closed. The deadline is the app's ``HEAD_READ_S``
(``GIN_HEAD_READ_S``). A connection idle between requests, with no byte of the next one sent,
is left to ``KEEPALIVE_S``; a WebSocket, once upgraded, to its own rules.

This leans on aiohttp's private internals: ``RequestHandler``'s ``data_received``,
``connection_lost`` and ``finish_response``, and its ``_waiter`` (pending while it waits for a
request), ``_messages`` and ``_request_count`` (the parsed requests), ``_upgraded``,
``_payload_parser``, ``_close``, ``_force_close`` and ``_loop``; ``Server``'s ``__call__``
(which makes a connection's handler), ``_kwargs`` and ``_loop``; ``AppRunner._make_server``.
``shared/infra/internals.py``'s ``TESTED`` bounds the aiohttp versions they were tested with.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from shared.contracts.api import ErrorBody, ErrorDetail
from shared.infra.web import DEFAULT_HEAD_READ_S, HEAD_READ_S

# Longer than ingress-nginx's upstream keep-alive (60 s): the proxy, not the service, ends an
# idle connection, so it never sends a request on one the service is closing.
KEEPALIVE_S = 75.0
# How long a connection answered 408 for its head is kept to read and drop what the client
# still sends (``HeadDeadline._head_overdue``).
LINGER_S = 2.0


class HeadDeadline(RequestHandler):
    """aiohttp's handler of one connection, with the head deadline (module docstring)."""

    __slots__ = ("_head_read_s", "_head_timer", "_last_payload", "_lingering")

    def __init__(self, manager: web.Server, *, head_read_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_read_s = head_read_s
        self._head_timer: asyncio.TimerHandle | None = None
        # The body of the last request parsed: bytes that arrive once it is whole begin a head.
        self._last_payload: StreamReader | None = None
        self._lingering = False  # the 408 sent: what the client sends still is read and dropped

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self._force_close or self._close or self._upgraded or self._payload_parser is not None:
            super().data_received(data)  # closing, or a WebSocket's (or an upgrade's) bytes
            return
        last = self._last_payload
        begins_a_head = bool(data) and (last is None or last.is_eof())
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._head_parsed()
            # Bytes behind the head of a request without a body begin the next one's (a head
            # ends with a line feed): pipelined, part of it sent with the one before.
            begins_a_head = (
                bool(data)
                and not data.endswith(b"\n")
                and self._last_payload is EMPTY_PAYLOAD
                and not self._upgraded
            )
        if begins_a_head and self._head_timer is None:
            self._head_timer = self._loop.call_later(self._head_read_s, self._head_overdue)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        parsed = self._request_count
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            if self._request_count != parsed:  # what followed a declined upgrade, parsed now
                self._head_parsed()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_timer()
        self._last_payload = None
        super().connection_lost(exc)

    def _head_parsed(self) -> None:
        self._stop_timer()
        if self._messages:
            self._last_payload = self._messages[-1][1]

    def _stop_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        transport = self.transport
        if self._force_close or self._close or self._upgraded or transport is None:
            return
        if self._waiter is None or self._waiter.done():
            # Still answering a request before it (pipelined): its head's bytes came early.
            self._head_timer = self._loop.call_later(self._head_read_s, self._head_overdue)
            return
        message = f"the request's headers did not arrive whole within {self._head_read_s:g} s"
        body = msgspec.json.encode(
            ErrorBody(error=ErrorDetail(code="request_timeout", message=message))
        )
        transport.write(
            b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        # Closed at once, with the client still sending, the socket would answer its next
        # bytes with a reset, which can discard the 408 before the client reads it: so the
        # 408 is sent and the sending side shut, what still comes is read and dropped, and the
        # connection closed once the client closes it, or after LINGER_S (force_close).
        self._lingering = True
        if transport.can_write_eof():
            transport.write_eof()
        self._head_timer = self._loop.call_later(LINGER_S, self.force_close)


class Server(web.Server):
    """aiohttp's low-level server, whose connections each get a ``HeadDeadline``."""

    def __init__(self, *args: Any, head_read_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_read_s = head_read_s

    def __call__(self) -> RequestHandler:
        return HeadDeadline(self, loop=self._loop, head_read_s=self.head_read_s, **self._kwargs)


class Runner(web.AppRunner):
    """aiohttp's ``AppRunner``, serving through ``Server``: the head deadline is the app's
    ``HEAD_READ_S`` (``DEFAULT_HEAD_READ_S`` when unset)."""

    __slots__ = ()

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app started, then aiohttp's server of it
        return Server(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            head_read_s=self.app.get(HEAD_READ_S, DEFAULT_HEAD_READ_S),
            **made._kwargs,
        )


def run(
    app: web.Application,
    *,
    host: str,
    port: int,
    backlog: int,
    shutdown_timeout: float,
    access_log: logging.Logger | None,
) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then drain, as ``web.run_app`` does, through
    ``Runner``: the runner's cleanup (on_shutdown, the connections' drain within
    ``shutdown_timeout``, on_cleanup) runs before any task left is cancelled."""
    loop = asyncio.new_event_loop()
    main_task = loop.create_task(
        _serve(
            app,
            host=host,
            port=port,
            backlog=backlog,
            shutdown_timeout=shutdown_timeout,
            access_log=access_log,
        )
    )
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main_task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not main_task.done():  # done: it failed at startup, and that is raised as is
                main_task.cancel()
                with suppress(asyncio.CancelledError):
                    loop.run_until_complete(main_task)
        finally:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


async def _serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    backlog: int,
    shutdown_timeout: float,
    access_log: logging.Logger | None,
) -> None:
    runner = Runner(
        app,
        handle_signals=True,  # SIGTERM and SIGINT raise GracefulExit
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=KEEPALIVE_S,
        access_log=access_log,
        handler_cancellation=False,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=backlog)
        await site.start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task still running and wait for them; report one that failed."""
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception during shutdown",
                    "exception": task.exception(),
                    "task": task,
                }
            )
