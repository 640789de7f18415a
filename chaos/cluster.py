"""Production's shape on one machine, under faults (issue 28): ``make chaos-cluster``.

Servers, throwaway, under ``.run/chaos-cluster/<time>/`` (deleted at the end, their logs
kept there): a PostgreSQL primary and a synchronous standby (``chaos/pgpair.py``; asynchronous
with ``CHAOS_SYNC=off``) found by a multi-host URL with ``target_session_attrs=read-write``,
and a RabbitMQ cluster of three nodes (``chaos/rabbits.py``) whose every node the services'
URL names. The services as processes: two table replicas (their relay apart), two table relays,
two bot workers, two timers, the chat. ``table-b`` reaches PostgreSQL through a proxy of its
own (``chaos/proxy.py``) on each node, so it alone can be cut off.

People and bots play over HTTP (``chaos/run.py``'s players, failing over between the
replicas); a subscriber reads the history stream by offset as docs/subscribing.md says (and
resumes from its last offset on another node when its node goes); a spectator watches each
table's WebSocket (and resumes by seq when the socket closes). Meanwhile, one after another
with ``CHAOS_GAP_S`` of play between: kill -9 of the PostgreSQL primary and promotion of the
standby, the old primary back as a standby, the same back the other way, the RabbitMQ node
leading the command queue stopped and started, then another, kill -9 of the relay that holds
the outbox lock, and ``table-b`` cut off from the database for 20 s (its connections reset,
then new ones held unanswered).

The report is one JSON object, the last line of stdout; the run fails (exit 1) unless each
of ``chaos.verdict.MUST_BE_ZERO`` is 0: ``lost_acked`` (a command answered 200 whose id or
version the final primary's log lacks), ``seq_reused`` (an event id seen with two bodies in
the log, the history stream, a socket), ``audit_missing`` (logged events the history stream
never delivered), ``order_breaks`` (in the stream, or within one socket), ``stuck``,
``dead_lettered`` (in ``gin.dead``), ``http_500`` (a 5xx other than 503), ``fault_errors``.

Settings: ``CHAOS_SYNC`` (``on``), ``CHAOS_GAP_S`` (20 s of play between faults),
``CHAOS_PEOPLE_MATCHES`` (2 at once), ``CHAOS_BOT_MATCHES`` (3 at once), ``CHAOS_NODE_DOWN_S``
(15 s a RabbitMQ node stays stopped), ``CHAOS_REJOIN_AFTER_S`` (5 s from a promotion to the old
primary's rejoining), ``CHAOS_CUT_S`` (20 s), ``CHAOS_DRAIN_S`` (150 s at most for the matches
under way to end), ``CHAOS_DIR`` (``.run/chaos-cluster``), ``CHAOS_SEED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import re
import shutil
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
import aiohttp
import asyncpg

from chaos import verdict
from chaos.proxy import CutProxy
from chaos.run import (
    DONE,
    PREFIX,
    SECRET,
    Fleet,
    Ledger,
    Player,
    bot_match,
    chaos_settings,
    keep_playing,
    lost_moves,
    missed_events,
    non_json_lines,
    order_breaks,
    outbox_drained,
    people_match,
)
from shared.contracts.names import COMMANDS_QUEUE, DEAD_LETTER, HISTORY_STREAM
from shared.infra.auth import mint

if TYPE_CHECKING:
    from chaos.pgpair import PgPair
    from chaos.rabbits import RabbitCluster

ROOT = Path(__file__).resolve().parent.parent
MODULES = {
    "table-a": "services.table",
    "table-b": "services.table",
    "relay-a": "services.table.relay",
    "relay-b": "services.table.relay",
    "bots-a": "services.bots",
    "bots-b": "services.bots",
    "timers-a": "services.timers",
    "timers-b": "services.timers",
    "chat": "services.chat",
}
RELAYS = ("relay-a", "relay-b")
# The end of a match for a spectator: nothing more comes (the players offer no rematch).
LAST_EVENTS = ("match_ended", "table_closed", "table_expired")
WINDOW_S = 10.0
AFTER_FAULT_S = 60.0


def log(message: str) -> None:
    print(f"chaos-cluster: {message}", file=sys.stderr, flush=True)


def through_proxy(url: str, ports: dict[int, int]) -> str:
    """A multi-host PostgreSQL URL with each ``host:port`` of ``ports`` moved to its proxy's.

    >>> through_proxy("postgresql://postgres@127.0.0.1:5001,127.0.0.1:5002/gin?"
    ...               "target_session_attrs=read-write", {5001: 7001, 5002: 7002})
    'postgresql://postgres@127.0.0.1:7001,127.0.0.1:7002/gin?target_session_attrs=read-write'
    """
    scheme, rest = url.split("://", 1)
    netloc, _, tail = rest.partition("/")
    user, at, hosts = netloc.rpartition("@")

    def moved(match: re.Match[str]) -> str:
        port = int(match.group(2))
        if port not in ports:
            raise ValueError(f"no proxy for port {port} of {url}")
        return f"{match.group(1)}:{ports[port]}"

    hosts = re.sub(r"([^,:]+):(\d+)", moved, hosts)
    return f"{scheme}://{user}{at}{hosts}/{tail}"


def published_total(metrics: str) -> float:
    """The relay's ``gin_outbox_published_total`` from its /metrics text (0 if absent).

    >>> published_total("# HELP x\\ngin_outbox_published_total 42.0\\ngin_outbox_published 1")
    42.0
    """
    for line in metrics.splitlines():
        if line.startswith("gin_outbox_published_total "):
            return float(line.split()[1])
    return 0.0


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets (its fds' inodes in /proc/net/tcp*)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# --- the players, timed ---------------------------------------------------------------------


@dataclass
class Timeline:
    """Seconds since play began, and the command latencies the players saw."""

    began: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)
    # when the answer came (seconds since play began), how long it took: a request stalled
    # through a fault counts in the window where the player got it
    latencies: list[tuple[float, float]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.began


class TimedPlayer(Player):
    """``chaos.run.Player`` whose requests (a view, a move, a new table) are timed from the
    first try to the answer, the retries of a 503 or a lost connection included: what the
    person waits. A replica cut off from the database answers views with 503 as well, and the
    player waits there before a move: timing moves alone would not show it.

    A 503 is retried on either replica, as the Service in front of them would send it: the
    players of ``make chaos`` retry it where it came from, which makes a replica cut off from
    the database hold every player that lands on it for the whole cut."""

    RETRY_503_ANYWHERE = True

    def __init__(
        self,
        session: aiohttp.ClientSession,
        bases: list[str],
        ledger: Ledger,
        timeline: Timeline,
    ) -> None:
        super().__init__(session, bases, ledger)
        self.timeline = timeline

    async def call(
        self, method: str, path: str, body: Any = None, bases: list[str] | None = None
    ) -> tuple[int, Any]:
        began = time.monotonic()
        try:
            return await super().call(method, path, body, bases)
        finally:
            now = time.monotonic()
            self.timeline.latencies.append((now - self.timeline.began, now - began))


# --- the history stream, read by offset ------------------------------------------------------


class HistoryReader:
    """A team's reader of the history stream (docs/subscribing.md): from ``first``, then, after
    any loss of its node, channel or consumer, from the offset after the last one it handled,
    on the next node. Every body is kept to compare with the log and the sockets."""

    def __init__(self, urls: list[str], queue: str) -> None:
        self.urls = urls
        self.queue = queue
        self.next_offset: int | None = None
        self.seen: list[tuple[verdict.EventId, str]] = []
        self.arrivals: list[tuple[str, int]] = []  # table events: table id, seq
        self.first: set[verdict.EventId] = set()
        self.repeats = 0
        self.attaches = 0
        self.last = time.monotonic()
        self.task: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        index = random.randrange(len(self.urls))
        while not self.stopping.is_set():
            url = self.urls[index % len(self.urls)]
            index += 1
            try:
                await self._attach(url)
            except (aio_pika.exceptions.AMQPException, OSError, TimeoutError, RuntimeError) as exc:
                log(f"history reader: {url.rsplit('@', 1)[-1]}: {exc!r}; next node")
            if not self.stopping.is_set():
                await asyncio.sleep(1.0)

    async def _attach(self, url: str) -> None:
        connection = await aio_pika.connect(url, timeout=5)
        lost = asyncio.Event()
        try:
            connection.close_callbacks.add(lambda *_: lost.set())
            channel = await connection.channel()
            channel.close_callbacks.add(lambda *_: lost.set())
            await channel.set_qos(prefetch_count=500)  # a stream needs a prefetch
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(lambda *_: lost.set())
            queue = await channel.get_queue(self.queue)
            offset: int | str = "first" if self.next_offset is None else self.next_offset
            await queue.consume(self._on_message, arguments={"x-stream-offset": offset})
            self.attaches += 1
            if self.attaches > 1:
                log(f"history reader: resumed at offset {offset} on {url.rsplit('@', 1)[-1]}")
            stop = asyncio.create_task(self.stopping.wait())
            gone = asyncio.create_task(lost.wait())
            await asyncio.wait([stop, gone], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            gone.cancel()
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await connection.close()

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        offset = int((message.headers or {}).get("x-stream-offset", -1))  # type: ignore[arg-type]
        if self.next_offset is not None and 0 <= offset < self.next_offset:
            self.repeats += 1  # the start of a chunk, before the offset asked for
        else:
            envelope = json.loads(message.body)
            key = verdict.event_id(envelope)
            self.seen.append((key, verdict.canonical(message.body)))
            if key[0] == "table" and key not in self.first:
                self.first.add(key)
                self.arrivals.append((key[1], key[2]))
            if offset >= 0:
                self.next_offset = offset + 1
        self.last = time.monotonic()
        await message.ack()

    async def quiet(self, for_s: float, within_s: float) -> None:
        """Until attached and nothing new for ``for_s`` (at most ``within_s``)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.attaches and time.monotonic() - self.last >= for_s:
                return
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        self.stopping.set()
        if self.task is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await self.task


# --- the sockets ----------------------------------------------------------------------------


class SocketReader:
    """A spectator on the WebSocket of every table started: records each event frame; when a
    socket closes it reconnects (the other replica first) and, as the protocol says, fills
    what it missed from ``GET /v1/tables/{id}/events?after=<last seq>``."""

    def __init__(self, session: aiohttp.ClientSession, bases: list[str]) -> None:
        self.session = session
        self.bases = bases
        self.token = mint(SECRET, f"spectator-{uuid.uuid4().hex[:12]}", "Spectator")
        self.seen: list[tuple[verdict.EventId, str]] = []
        # table events in the order each socket gave them, keyed by table and connection:
        # within one socket the protocol sends each seq once and in order
        self.arrivals: list[tuple[str, int]] = []
        self.frames = 0
        self.filled = 0
        self.reconnects = 0
        self.refused: Counter[int] = Counter()  # a socket's upgrade or a fill answered 5xx
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def watch(self, table_id: str) -> None:
        if table_id not in self.tasks:
            self.tasks[table_id] = asyncio.create_task(self._follow(table_id))

    async def _follow(self, table_id: str) -> None:
        last = 0
        index = random.randrange(len(self.bases))
        for connection in range(1, 10_000):
            base = self.bases[index % len(self.bases)]
            index += 1
            url = base.replace("http://", "ws://", 1) + f"/v1/tables/{table_id}/ws"
            try:
                async with self.session.ws_connect(url, heartbeat=10.0) as ws:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        frame = json.loads(msg.data)
                        if frame.get("kind") == "snapshot":
                            last = await self._fill(base, table_id, last)
                            if frame["view"]["status"] in DONE:
                                return
                        elif frame.get("kind") == "event":
                            self.frames += 1
                            envelope = frame["event"]
                            key = verdict.event_id(envelope)
                            self.seen.append((key, verdict.canonical(json.dumps(envelope))))
                            if key[0] == "table":
                                self.arrivals.append((f"{table_id}#{connection}", key[2]))
                                last = max(last, key[2])
                                if envelope["type"] in LAST_EVENTS:
                                    return
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status >= 500:
                    self.refused[exc.status] += 1
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            self.reconnects += 1
            await asyncio.sleep(0.5)

    async def _fill(self, base: str, table_id: str, after: int) -> int:
        """The events after ``after`` from the table's log over HTTP; the newest seq."""
        for _ in range(20):
            try:
                async with self.session.get(
                    f"{base}/v1/tables/{table_id}/events",
                    params={"after": str(after)},
                    headers={"Authorization": f"Bearer {self.token}"},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as r:
                    if r.status >= 500:
                        self.refused[r.status] += 1
                    if r.status == 200:
                        for envelope in await r.json():
                            self.filled += 1
                            self.seen.append(
                                (
                                    verdict.event_id(envelope),
                                    verdict.canonical(json.dumps(envelope)),
                                )
                            )
                            after = max(after, int(envelope["seq"]))
                        return after
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            await asyncio.sleep(0.5)
        return after

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


# --- the faults -----------------------------------------------------------------------------


@dataclass
class Fault:
    what: str
    at_s: float
    took_s: float = 0.0
    error: str | None = None
    ready_s: float | None = None  # until every service answered /readyz again


class Chaos:
    """The servers, the proxies and the fleet, and the faults done to them."""

    def __init__(
        self,
        pair: PgPair,
        rabbits: RabbitCluster,
        proxies: list[CutProxy],
        fleet: Fleet,
        timeline: Timeline,
    ) -> None:
        self.pair = pair
        self.rabbits = rabbits
        self.proxies = proxies
        self.fleet = fleet
        self.timeline = timeline
        self.faults: list[Fault] = []
        self.stopped_node: str | None = None

    async def apply(self, what: str, action: Callable[[], Awaitable[str | None]]) -> None:
        """Do one fault, timed; then wait for every service to be ready again."""
        fault = Fault(what, round(self.timeline.now(), 1))
        log(f"fault at {fault.at_s:.0f} s: {what}")
        began = time.monotonic()
        try:
            detail = await action()
            if detail:
                fault.what = f"{what} ({detail})"
        except Exception as exc:
            fault.error = repr(exc)[:500]
            log(f"fault failed: {fault.error}")
        fault.took_s = round(time.monotonic() - began, 1)
        self.faults.append(fault)
        try:
            await self.fleet.ready(90.0)
            fault.ready_s = round(time.monotonic() - began, 1)
        except (RuntimeError, TimeoutError) as exc:
            log(f"not every service is ready after {what}: {exc!r}")

    async def failover(self) -> str:
        """kill -9 of the primary, the standby promoted."""
        was = self.pair.primary()
        await asyncio.to_thread(self.pair.failover)
        return f"{was} -> {self.pair.primary()}"

    async def rejoin(self) -> str:
        await asyncio.to_thread(self.pair.rejoin_old_primary)
        return f"primary {self.pair.primary()}"

    async def node_down(self, queue: str, down_s: float) -> str:
        """Stop the node leading ``queue`` (another than the last one stopped), start it again
        after ``down_s``."""
        leader = await asyncio.to_thread(self.rabbits.leader_of, queue)
        name = leader
        if name == self.stopped_node:
            name = random.choice([n for n in self.rabbits.names() if n != self.stopped_node])
        await asyncio.to_thread(self.rabbits.stop_node, name)
        self.stopped_node = name
        await asyncio.sleep(down_s)
        await asyncio.to_thread(self.rabbits.start_node, name)
        return f"{name}, leader of {queue}: {leader}"

    async def kill_lock_holder(self, session: aiohttp.ClientSession) -> str:
        """kill -9 of the relay holding the outbox lock, caught in the act (``pg_locks``: the
        session holding an advisory lock is one of a relay's connections), started again 2 s
        later as Kubernetes would. Failing that within 5 s, the relay that published more in
        the last 2 s (its /metrics)."""
        holder, how = await self._lock_holder(5.0)
        if holder is None:
            holder, how = await self._busier_relay(session)
        self.fleet.kill(holder)
        await asyncio.sleep(2.0)
        self.fleet.start(holder)
        return f"{holder}, {how}"

    async def _lock_holder(self, within_s: float) -> tuple[str | None, str]:
        conn = await asyncpg.connect(self.pair.url_for("gin"), timeout=5)
        try:
            deadline = time.monotonic() + within_s
            while time.monotonic() < deadline:
                ports = await conn.fetch(
                    "SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                    " WHERE l.locktype = 'advisory' AND l.granted"
                )
                held = {r["client_port"] for r in ports}
                for name in RELAYS:
                    if held & local_ports(self.fleet.running[name].proc.pid):
                        return name, "seen holding the lock in pg_locks"
                await asyncio.sleep(0.01)
        finally:
            await conn.close()
        return None, ""

    async def _busier_relay(self, session: aiohttp.ClientSession) -> tuple[str, str]:
        async def counts() -> dict[str, float]:
            out = {}
            for name in RELAYS:
                try:
                    async with session.get(self.fleet.base(name) + "/metrics") as r:
                        out[name] = published_total(await r.text())
                except (aiohttp.ClientError, OSError):
                    out[name] = 0.0
            return out

        before = await counts()
        await asyncio.sleep(2.0)
        after = await counts()
        moved = {name: after[name] - before[name] for name in RELAYS}
        return max(RELAYS, key=lambda n: moved[n]), f"published in 2 s: {moved}"

    async def cut(self, cut_s: float) -> str:
        """table-b's connections to PostgreSQL reset, new ones held, for ``cut_s``."""
        reset = sum(proxy.drop() for proxy in self.proxies)
        await asyncio.sleep(cut_s)
        held = sum(proxy.forward() for proxy in self.proxies)
        return f"{reset} connections reset, {held} new ones held"


# --- the run --------------------------------------------------------------------------------


def keep_server_logs(pair: PgPair | None, rabbits: RabbitCluster | None, to: Path) -> None:
    """Copy the servers' logs into the run's folder before their data goes."""
    sources: list[tuple[str, Path]] = []
    if pair is not None:
        sources += [(f"postgres-{p.parent.parent.name}", p) for p in pair.base.glob("*/log/*")]
    if rabbits is not None:
        sources += [
            (f"rabbit-{p.parent.parent.name}", p) for p in rabbits.state_dir.glob("*/log/*")
        ]
    to.mkdir(exist_ok=True)
    for prefix, path in sources:
        with contextlib.suppress(OSError):
            shutil.copyfile(path, to / f"{prefix}-{path.name}")


async def dead_letters(urls: list[str]) -> int:
    """Messages in ``gin.dead``, asked of the first node that answers."""
    for url in urls:
        try:
            connection = await aio_pika.connect(url, timeout=5)
        except (aio_pika.exceptions.AMQPException, OSError, TimeoutError):
            continue
        async with connection:
            channel = await connection.channel()
            dead = await channel.declare_queue(PREFIX + DEAD_LETTER, passive=True)
            return dead.declaration_result.message_count or 0
    raise RuntimeError("no RabbitMQ node answers")


async def main() -> int:
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    from chaos.pgpair import PgPair
    from chaos.rabbits import RabbitCluster

    random.seed(int(os.environ.get("CHAOS_SEED", "0")) or None)
    synchronous = os.environ.get("CHAOS_SYNC", "on").lower() not in ("off", "0", "false", "no")
    people = int(os.environ.get("CHAOS_PEOPLE_MATCHES", "2"))
    bots = int(os.environ.get("CHAOS_BOT_MATCHES", "3"))
    gap_s = float(os.environ.get("CHAOS_GAP_S", "20"))
    down_s = float(os.environ.get("CHAOS_NODE_DOWN_S", "15"))
    rejoin_after_s = float(os.environ.get("CHAOS_REJOIN_AFTER_S", "5"))
    cut_s = float(os.environ.get("CHAOS_CUT_S", "20"))
    drain_s = float(os.environ.get("CHAOS_DRAIN_S", "150"))
    run_dir = Path(os.environ.get("CHAOS_DIR", ROOT / ".run" / "chaos-cluster")) / time.strftime(
        "%Y%m%dT%H%M%S"
    )
    run_dir.mkdir(parents=True)
    state_dir = run_dir / "servers"
    began = time.monotonic()
    log(f"servers and logs under {run_dir}; standby {'synchronous' if synchronous else 'async'}")
    pair: PgPair | None = None
    rabbits: RabbitCluster | None = None
    fleet: Fleet | None = None
    proxies: list[CutProxy] = []
    history: HistoryReader | None = None
    try:
        # Both at once; one that started is stopped below even if the other failed.
        started = await asyncio.gather(
            asyncio.to_thread(PgPair, state_dir / "pg", synchronous=synchronous),
            asyncio.to_thread(RabbitCluster, state_dir / "rabbit", nodes=3),
            return_exceptions=True,
        )
        pair = started[0] if isinstance(started[0], PgPair) else None
        rabbits = started[1] if isinstance(started[1], RabbitCluster) else None
        for result in started:
            if isinstance(result, BaseException):
                raise result
        assert pair is not None
        assert rabbits is not None
        log(f"servers up in {time.monotonic() - began:.0f} s; primary {pair.primary()}")
        conn = await asyncpg.connect(pair.admin_url)
        try:
            await conn.execute("CREATE DATABASE gin")
        finally:
            await conn.close()
        db_url = pair.url_for("gin")
        for port in pair.ports():
            proxy = CutProxy(port)
            await proxy.start()
            proxies.append(proxy)
        b_url = through_proxy(db_url, {p.target: p.port for p in proxies})
        settings = chaos_settings(db_url, rabbits.url, relay_apart=True)
        fleet = Fleet(settings, run_dir, MODULES, {"table-b": {"GIN_DATABASE_URL": b_url}})
        # One table replica first: it makes the schema, and the topology the others bind to.
        fleet.start("table-a")
        await fleet.ready(120.0)
        for name in MODULES:
            if name != "table-a":
                fleet.start(name)
        await fleet.ready(120.0)
        history = HistoryReader(rabbits.urls, PREFIX + HISTORY_STREAM)
        history.start()
        log(f"every service is ready at {time.monotonic() - began:.0f} s; playing")

        ledger = Ledger()
        timeline = Timeline()
        chaos = Chaos(pair, rabbits, proxies, fleet, timeline)
        stop = asyncio.Event()
        tables = [fleet.base("table-a"), fleet.base("table-b")]
        chat = fleet.base("chat")
        async with aiohttp.ClientSession() as session:
            sockets = SocketReader(session, tables)

            def player() -> TimedPlayer:
                return TimedPlayer(session, tables, ledger, timeline)

            workers = [
                asyncio.create_task(
                    keep_playing(
                        lambda: people_match([player(), player()], chat, ledger), stop, ledger
                    )
                )
                for _ in range(people)
            ] + [
                asyncio.create_task(
                    keep_playing(lambda: bot_match(player(), chat, ledger), stop, ledger)
                )
                for _ in range(bots)
            ]

            async def spectate() -> None:
                while True:
                    for table_id in list(ledger.started):
                        sockets.watch(table_id)
                    await asyncio.sleep(0.3)

            spectator = asyncio.create_task(spectate())

            async def pause() -> None:
                log(
                    f"{timeline.now():.0f} s of play: {len(ledger.acknowledged)} moves acked,"
                    f" {len(ledger.started)} matches, answers {dict(ledger.answers)}"
                )
                await asyncio.sleep(gap_s)

            async def failover_and_back_soon(what: str) -> None:
                await chaos.apply(what, chaos.failover)
                await asyncio.sleep(rejoin_after_s)
                await chaos.apply("postgresql old primary back as a standby", chaos.rejoin)

            await pause()
            await failover_and_back_soon("postgresql primary kill -9, standby promoted")
            await pause()
            await chaos.apply(
                "rabbitmq node leading the command queue stopped",
                lambda: chaos.node_down(PREFIX + COMMANDS_QUEUE, down_s),
            )
            await pause()
            await failover_and_back_soon("postgresql failover back, kill -9, standby promoted")
            await pause()
            await chaos.apply(
                "rabbitmq another node stopped (the history stream's leader if another)",
                lambda: chaos.node_down(PREFIX + HISTORY_STREAM, down_s),
            )
            await pause()
            await chaos.apply(
                "kill -9 of the relay holding the outbox lock",
                lambda: chaos.kill_lock_holder(session),
            )
            await pause()
            await chaos.apply(
                f"table-b cut off from postgresql {cut_s:.0f} s", lambda: chaos.cut(cut_s)
            )
            await pause()
            stop.set()
            budget = max(30.0, 840.0 - (time.monotonic() - began) - 60.0)
            drain_s = min(drain_s, budget)
            log(
                f"faults done at {time.monotonic() - began:.0f} s; draining {drain_s:.0f} s at most"
            )
            _, pending = await asyncio.wait(workers, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            spectator.cancel()
            drained = await outbox_drained(db_url, within_s=60.0)
            await history.quiet(for_s=3.0, within_s=45.0)
            await asyncio.sleep(1.0)
            await sockets.stop()
        await history.stop()
        # One more reader, from the first offset, after everything: what the stream holds.
        # An event the live reader missed and this one has was lost on the way to the reader
        # (its resuming); one neither has never reached the stream.
        log("reading the whole history stream again")
        reread = HistoryReader(rabbits.urls, PREFIX + HISTORY_STREAM)
        reread.start()
        await reread.quiet(for_s=3.0, within_s=60.0)
        await reread.stop()

        log("reading the final primary's log")
        conn = await asyncpg.connect(db_url)
        try:
            events = await conn.fetch(
                "SELECT table_id, seq, (envelope->>'version')::int AS version,"
                " envelope::text AS body FROM gin_table.events"
            )
            commands = await conn.fetch("SELECT table_id, command_id FROM gin_table.commands")
            rows = await conn.fetch("SELECT table_id, status FROM gin_table.tables")
            statuses: dict[str, str] = {r["table_id"]: r["status"] for r in rows}
        finally:
            await conn.close()
        logged = [(r["table_id"], r["seq"], r["version"]) for r in events]
        known = {(r["table_id"], r["command_id"]) for r in commands}
        lost = lost_moves(ledger.acknowledged, known, logged)
        missed = missed_events(logged, history.arrivals)
        written = {(r["table_id"], r["seq"]): json.loads(r["body"])["occurred_at"] for r in events}
        missed_at = verdict.counts_by_window([written[m] for m in missed], timeline.wall, WINDOW_S)
        log_seen = [
            (("table", r["table_id"], r["seq"]), verdict.canonical(r["body"])) for r in events
        ]
        reused = verdict.reused_ids(log_seen + history.seen + reread.seen + sockets.seen)
        not_in_stream = missed_events(logged, reread.arrivals)
        dead = await dead_letters(rabbits.urls)
        over = {t for t in ledger.started if statuses.get(t) in DONE}
        stuck = {t for t in ledger.started if t not in over} | (ledger.stuck - over)
        fleet.stop()
        bad_lines, bad_examples = non_json_lines(fleet.logs)
        by_window = verdict.windows(timeline.latencies, WINDOW_S)
        http_5xx = sum(n for status, n in ledger.answers.items() if status >= 500)
        http_500 = http_5xx - ledger.answers.get(503, 0)
        http_500 += sum(n for status, n in sockets.refused.items() if status != 503)
        watched: dict[str, set[int]] = {}
        for (stream, table_id, seq), _ in sockets.seen:
            if stream == "table":
                watched.setdefault(table_id, set()).add(seq)
        socket_missing = [
            (t, seq) for t, seq, _ in logged if t in sockets.tasks and seq not in watched.get(t, ())
        ]
        report: dict[str, Any] = {
            "synchronous": synchronous,
            "acked_moves": len(ledger.acknowledged),
            "lost_acked": len(lost),
            "seq_reused": len(reused),
            "audit_missing": len(missed),
            "audit_missing_by_window": missed_at,
            "audit_missing_from_stream": len(not_in_stream),  # on a full read at the end
            "order_breaks": order_breaks(history.arrivals)
            + order_breaks(reread.arrivals)
            + order_breaks(sockets.arrivals),
            "stuck": len(stuck),
            "dead_lettered": dead,
            "http_5xx": http_5xx,
            "http_500": http_500,  # any 5xx but 503, the players' and the spectator's
            "fault_errors": sum(1 for f in chaos.faults if f.error),
            "faults": [
                {k: v for k, v in vars(f).items() if v is not None or k == "error"}
                for f in chaos.faults
            ],
            "latency": {
                "window_s": WINDOW_S,
                "windows": "start_s, p99_ms, max_ms, requests",
                "p99_ms": [[w["start_s"], w["p99_ms"], w["max_ms"], w["n"]] for w in by_window],
                "worst_after_fault": [
                    {
                        "what": f.what,
                        "at_s": f.at_s,
                        "worst": verdict.worst_after(by_window, f.at_s, AFTER_FAULT_S, WINDOW_S),
                        "slowest": verdict.worst_after(
                            by_window, f.at_s, AFTER_FAULT_S, WINDOW_S, key="max_ms"
                        ),
                        # the same until the next fault: this one's own, where they overlap
                        "worst_before_next": verdict.worst_after(
                            by_window, f.at_s, min(AFTER_FAULT_S, until), WINDOW_S
                        ),
                    }
                    for f, until in zip(
                        chaos.faults,
                        [b.at_s - a.at_s for a, b in itertools.pairwise(chaos.faults)]
                        + [AFTER_FAULT_S],
                        strict=False,  # no fault at all: nothing to zip
                    )
                ],
            },
            "matches_started": len(ledger.started),
            "matches_over": len(over),
            "events_logged": len(events),
            "history": {
                "events": len(history.seen),
                "attaches": history.attaches,
                "repeats": history.repeats,
            },
            "sockets": {
                "frames": sockets.frames,
                "filled_over_http": sockets.filled,
                "reconnects": sockets.reconnects,
                "tables": len(sockets.tasks),
                "5xx": {str(k): v for k, v in sorted(sockets.refused.items())},
                # events of a watched table its spectator never got, by socket or log
                "missing": len(socket_missing),
                "missing_examples": socket_missing[:5],
            },
            "outbox_drained": drained,
            "answers": {str(k): v for k, v in sorted(ledger.answers.items())},
            "unexpected_answers": [f"{s}: {str(b)[:200]}" for s, b in ledger.unexpected[:10]],
            "non_json_log_lines": bad_lines,
            "primary_at_end": pair.primary(),
            "examples": {
                "lost": lost[:5],
                "missed": missed[:5],
                "reused": [list(k) for k in list(reused)[:5]],
                "stuck": sorted(stuck)[:5],
                "non_json": bad_examples,
            },
            "seconds": round(time.monotonic() - began, 1),
            "logs": str(run_dir),
        }
        failed = verdict.failed(report)
        log("all zeros" if not failed else f"NOT zero: {', '.join(failed)}")
        print(json.dumps(report), flush=True)
        return 1 if failed else 0
    finally:
        if history is not None:
            await history.stop()
        if fleet is not None:
            fleet.stop()
        for proxy in proxies:
            await proxy.stop()
        keep_server_logs(pair, rabbits, run_dir / "servers-logs")
        if pair is not None:
            with contextlib.suppress(Exception):
                pair.stop()
        if rabbits is not None:
            with contextlib.suppress(Exception):
                rabbits.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
        log(f"servers stopped and deleted; logs in {run_dir}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
