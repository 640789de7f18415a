"""The backend under faults (issue 14, part 7): every service as a process (two table
replicas, chat, timers, bots) on a throwaway PostgreSQL and RabbitMQ of its own
(``scripts/servers.py``, under ``.run/chaos/``), matches between people and against bots played
over HTTP without pause, while faults hit one after the other: kill -9 of each service (it is
started again, as Kubernetes would), PostgreSQL shut down fast (a switchover) and immediately
(a crash) and started again, RabbitMQ stopped for 10 s. Players fail over to the other table
replica and retry what the service asks them to retry, with the same command id.

Then the report (one JSON object on stdout), every count of which must be 0:

- ``acknowledged_moves_lost``: a command answered 200 whose id is not in the table's commands
  or whose version has no event in the table's log;
- ``events_missed``: events of the tables' logs a subscriber of ``gin.events`` (a quorum
  queue bound to ``table.#`` before the first table) never got;
- ``order_breaks``: events a subscriber first got after a later one of the same table;
- ``dead_lettered``: messages in ``gin.dead``;
- ``stuck_matches``: matches not over once the faults are done and the players stop;
- ``non_json_log_lines``: lines of the services' output that are not one JSON object.

Settings: ``CHAOS_PEOPLE_MATCHES`` (2 at once), ``CHAOS_BOT_MATCHES`` (3 at once),
``CHAOS_GAP_S`` (8 s of play between faults), ``CHAOS_DIR`` (``.run/chaos``),
``CHAOS_SYNCHRONOUS_COMMIT`` (``on``, production's; ``off`` shows what the crash then loses).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import asyncpg

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.e2e.processes import Service, free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import servers  # noqa: E402

PREFIX = "chaos."
SECRET = "chaos-secret-that-is-long-enough-for-hs256"
PATIENCE_S = 120.0  # a request retried this long without an answer: the match is stuck
DRAIN_S = 180.0  # after the faults, for the matches under way to end
LEVELS = ("tito", "carmen", "luna")
DONE = ("match_over", "closed", "expired")


def log(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


class Stuck(Exception):
    """A request got no answer for ``PATIENCE_S``."""


# --- servers -------------------------------------------------------------------------------


class Postgres:
    """A throwaway PostgreSQL with production's durability (synchronous_commit on)."""

    def __init__(self, state_dir: Path, synchronous_commit: str = "on") -> None:
        self.state_dir = state_dir
        self.owner = servers.owner_of(state_dir)
        self.entry = servers.start_postgres(
            state_dir,
            servers.load_state(state_dir),
            servers.Installer(),
            120,
            conf={"synchronous_commit": synchronous_commit},
        )

    def start(self) -> None:
        """Start it again on its data and its port."""
        env = servers.pg_env()
        env.pop("PGCONNECT_TIMEOUT", None)
        env[servers.OWNER_ENV] = self.owner
        pg_ctl = servers.pg_bindir(servers.Installer()) / "pg_ctl"
        log_file = Path(self.entry.root) / "log" / "postgres.log"
        argv = [str(pg_ctl), "-D", self.entry.data_dir, "-l", str(log_file), "-w", "-t", "60"]
        result = servers.run(
            servers.as_user(self.entry.os_user, [*argv, "start"]),
            env=env,
            cwd=Path(self.entry.root),
            timeout=70,
        )
        if result.returncode != 0:
            raise RuntimeError(servers.output_of(result))
        self.entry.pid = servers.read_postmaster_pid(Path(self.entry.data_dir))

    def stop(self, how: signal.Signals) -> None:
        """SIGINT: fast shutdown (sessions get 57P01); SIGQUIT: immediate (a crash)."""
        pid = servers.pg_owned_pid(self.entry, self.owner)
        if pid is None:
            raise RuntimeError("the throwaway PostgreSQL is not running")
        servers.send_signal(pid, how)
        if not servers.wait_gone([pid], 60):
            raise RuntimeError("PostgreSQL did not stop")


class Rabbit:
    """A throwaway RabbitMQ node whose application is stopped and started."""

    def __init__(self, state_dir: Path) -> None:
        self.owner = servers.owner_of(state_dir)
        self.entry = servers.start_rabbitmq(
            state_dir, servers.load_state(state_dir), servers.Installer(), 180
        )

    def ctl(self, *args: str) -> None:
        result = servers.run(
            [str(servers.RABBIT_BIN_DIR / "rabbitmqctl"), "-n", self.entry.nodename, *args],
            env=servers.rabbit_env(self.entry, self.owner),
            cwd=Path(self.entry.root),
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(servers.output_of(result))


MODULES = {
    "table-a": "services.table",
    "table-b": "services.table",
    "chat": "services.chat",
    "timers": "services.timers",
    "bots": "services.bots",
}


class Fleet:
    """The services as processes, each on a port of its own for good (restarts reuse it).

    ``modules`` names each process's module (``MODULES`` by default); ``env`` gives some of
    them environment variables of their own, over the settings (another database URL, say).
    """

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        modules: dict[str, str] | None = None,
        env: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.modules = MODULES if modules is None else modules
        self.env = env or {}
        self.ports = {name: free_port() for name in self.modules}
        self.running: dict[str, Service] = {}
        self.logs: list[Path] = []

    def start(self, name: str) -> None:
        path = self.log_dir / f"{name}.{len(self.logs)}.log"
        self.logs.append(path)
        self.running[name] = Service(
            self.modules[name],
            self.settings,
            port=self.ports[name],
            log_to=path,
            GIN_LOG_LEVEL="info",
            **self.env.get(name, {}),
        )

    def base(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    async def ready(self, within_s: float = 90.0) -> None:
        for service in self.running.values():
            await service.ready(within_s)

    def kill(self, name: str) -> None:
        """kill -9, then a new process on the same port (what Kubernetes does)."""
        service = self.running[name]
        service.proc.kill()
        service.proc.wait()
        if service.output is not None:
            service.output.close()

    def stop(self) -> None:
        for service in self.running.values():
            service.terminate()
        for service in self.running.values():
            service.stop()


def chaos_settings(database_url: str, amqp_url: str, **changes: Any) -> Settings:
    """The services' settings under chaos: quick bots, resends and relay polls, a short wait
    for a database connection, no rate limits (the players are few and fast), JSON logs."""
    return Settings(
        **{
            "database_url": database_url,
            "amqp_url": amqp_url,
            "prefix": PREFIX,
            "dev_tokens": True,
            "bot_think_s": 0.0,
            "bot_turn_resend_s": 3.0,
            "relay_poll_s": 0.2,
            "db_acquire_timeout_s": 1.0,
            "log_format": "json",
            "log_level": "info",
            "auth_secret": SECRET,
            "rate_commands": 1_000_000,
            "rate_joins": 1_000_000,
            "rate_tables": 1_000_000,
            "rate_sockets": 1_000_000,
            "rate_refusals": 1_000_000,
            **changes,
        }
    )


# --- players --------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the players saw."""

    acknowledged: list[tuple[str, str, int]] = field(default_factory=list)  # table, id, version
    started: dict[str, str] = field(default_factory=dict)  # table id: kind of match
    finished: set[str] = field(default_factory=set)
    stuck: set[str] = field(default_factory=set)
    answers: Counter[int] = field(default_factory=Counter)
    unexpected: list[tuple[int, Any]] = field(default_factory=list)


class Player:
    """A person over HTTP who fails over between the table replicas and retries what the
    service asks to retry (503, a lost connection), with the same body.

    A 503 is retried on the same replica, unless ``RETRY_503_ANYWHERE``: then on either, as a
    load balancer in front of the replicas would send the retry."""

    RETRY_503_ANYWHERE = False

    def __init__(self, session: aiohttp.ClientSession, bases: list[str], ledger: Ledger) -> None:
        self.session = session
        self.bases = bases
        self.ledger = ledger
        name = random.choice(["Ana", "Bia", "Caio", "Duda", "Enzo"])
        self.token = mint(SECRET, f"{name.lower()}-{uuid.uuid4().hex[:12]}", name)
        self.seen = 0  # the newest table version this person has seen (the chat waits for it)

    async def call(
        self, method: str, path: str, body: Any = None, bases: list[str] | None = None
    ) -> tuple[int, Any]:
        choices = bases or self.bases
        index = random.randrange(len(choices))
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            base = choices[index % len(choices)]
            try:
                async with asyncio.timeout(10):
                    async with self.session.request(
                        method,
                        base + path,
                        json=body,
                        headers={"Authorization": f"Bearer {self.token}"},
                    ) as r:
                        text = await r.text()
                        status, retry_after = r.status, r.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError, ConnectionError):
                index += 1  # the other replica
                await asyncio.sleep(0.2)
                continue
            self.ledger.answers[status] += 1
            if status == 503:
                await asyncio.sleep(min(float(retry_after or 1), 1.0))
                if self.RETRY_503_ANYWHERE:
                    index = random.randrange(len(choices))
                continue
            return status, json.loads(text) if text else None
        raise Stuck(f"{method} {path}")

    async def turn(self, table_id: str) -> str:
        """Play one move if it is this person's turn; the table's status."""
        status, view = await self.call("GET", f"/v1/tables/{table_id}")
        if status != 200:
            self.ledger.unexpected.append((status, view))
            return "playing"
        self.seen = max(self.seen, int(view["version"]))
        hand = view.get("hand")
        if view["status"] != "playing" or hand is None or hand["to_act"] != view["you"]:
            return str(view["status"])
        move = choose(view)
        command_id = f"p-{uuid.uuid4().hex[:16]}"
        body = {**move, "command_id": command_id, "expected_version": view["version"]}
        status, answer = await self.call("POST", f"/v1/tables/{table_id}/commands", body)
        if status == 200:
            self.ledger.acknowledged.append((table_id, command_id, int(answer["version"])))
        elif status != 409:  # a stale view (the bot or a timer moved first) is normal
            self.ledger.unexpected.append((status, answer))
        return "playing"


def choose(view: dict[str, Any]) -> dict[str, Any]:
    """A sensible move from ``legal``: knock when it can, else the arrangement's discard."""
    legal = view["legal"]
    knocks = [m for m in legal if m["type"] in ("big_gin", "knock")]
    if knocks:
        return {k: v for k, v in knocks[0].items() if k != "deadwood"}
    hint = view["hand"]["my_arrangement"].get("discard")
    if hint and any(m["type"] == "discard" for m in legal):
        return {"type": "discard", "card": hint}
    for kind in ("pass_upcard", "draw", "take_upcard", "discard"):
        for move in legal:
            if move["type"] == kind:
                return dict(move)
    return dict(legal[0])


async def people_match(players: list[Player], chat: str, ledger: Ledger) -> None:
    """Two people: create, join, chat once, play to the end."""
    a, b = players
    target = random.choice([1, 10])
    status, created = await a.call("POST", "/v1/tables", {"options": {"target": target}})
    if status != 201:
        ledger.unexpected.append((status, created))
        return
    table_id = created["table_id"]
    ledger.started[table_id] = "people"
    status, joined = await b.call(
        "POST", f"/v1/tables/{table_id}/join", {"invite_code": created["invite_code"]}
    )
    if status not in (200, 409):  # 409: a retried join that had taken the seat
        ledger.unexpected.append((status, joined))
    await play(table_id, [a, b], chat, ledger)


async def bot_match(player: Player, chat: str, ledger: Ledger) -> None:
    """A person and a bot of a random level."""
    level = random.choice(LEVELS)
    status, created = await player.call("POST", "/v1/tables", {"options": {"target": 1}})
    if status != 201:
        ledger.unexpected.append((status, created))
        return
    table_id = created["table_id"]
    ledger.started[table_id] = f"bot:{level}"
    status, seated = await player.call("POST", f"/v1/tables/{table_id}/bot", {"level": level})
    if status not in (200, 409):
        ledger.unexpected.append((status, seated))
    await play(table_id, [player], chat, ledger)


async def play(table_id: str, players: list[Player], chat: str, ledger: Ledger) -> None:
    said = False
    try:
        while True:
            statuses = [await p.turn(table_id) for p in players]
            if any(s in DONE for s in statuses):
                ledger.finished.add(table_id)
                return
            if not said and random.random() < 0.05:
                message = {"text": "boa", "after_version": players[0].seen}
                status, body = await players[0].call(
                    "POST", f"/v1/tables/{table_id}/messages", message, [chat]
                )
                said = status == 201
                if not said:
                    ledger.unexpected.append((status, body))
            await asyncio.sleep(random.uniform(0.02, 0.1))
    except Stuck:
        ledger.stuck.add(table_id)


async def keep_playing(
    match: Callable[[], Awaitable[None]], stop: asyncio.Event, ledger: Ledger
) -> None:
    while not stop.is_set():
        await match()


# --- the subscriber -------------------------------------------------------------------------


class Subscriber:
    """A subscriber of every table event, on a quorum queue of its own."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, int]] = []
        self.last = time.monotonic()
        self.connection: aio_pika.abc.AbstractRobustConnection | None = None

    async def start(self, url: str) -> None:
        self.connection = await aio_pika.connect_robust(url)
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=500)
        events = await channel.declare_exchange(
            PREFIX + "gin.events", aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(
            PREFIX + "chaos.subscriber", durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(events, "table.#")
        await queue.consume(self.on_message)

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        envelope = json.loads(message.body)
        self.arrivals.append((envelope["table_id"], int(envelope["seq"])))
        self.last = time.monotonic()
        await message.ack()

    async def quiet(self, for_s: float, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if time.monotonic() - self.last >= for_s:
                return
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


# --- the run --------------------------------------------------------------------------------


async def wait_ready(fleet: Fleet, within_s: float = 90.0) -> None:
    """Every service answers /readyz 200 (after a restart, or a server coming back)."""
    await fleet.ready(within_s)


async def outbox_drained(db_url: str, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            conn = await asyncpg.connect(db_url)
            try:
                waiting = 0
                for schema in ("gin_table", "gin_chat", "gin_timers"):
                    waiting += await conn.fetchval(
                        f"SELECT count(*) FROM {schema}.outbox WHERE published_at IS NULL"
                    )
            finally:
                await conn.close()
            if waiting == 0:
                return True
        await asyncio.sleep(0.5)
    return False


def lost_moves(
    acknowledged: list[tuple[str, str, int]],
    known: set[tuple[str, str]],
    logged: list[tuple[str, int, int]],
) -> list[tuple[str, str, int]]:
    """Commands answered 200 (table, command id, version) whose id the table does not know, or
    whose version has no event in its log (table, seq, version).

    >>> lost_moves([("t", "a", 3), ("t", "b", 4), ("t", "c", 5)], {("t", "a"), ("t", "c")},
    ...            [("t", 1, 3), ("t", 2, 4)])
    [('t', 'b', 4), ('t', 'c', 5)]
    """
    versions = {(table_id, version) for table_id, _, version in logged}
    return [(t, c, v) for t, c, v in acknowledged if (t, c) not in known or (t, v) not in versions]


def missed_events(
    logged: list[tuple[str, int, int]], arrivals: list[tuple[str, int]]
) -> list[tuple[str, int]]:
    """Events of the tables' logs (table, seq, version) the subscriber never got.

    >>> missed_events([("t", 1, 1), ("t", 2, 2), ("u", 1, 1)], [("t", 2), ("t", 2), ("u", 1)])
    [('t', 1)]
    """
    received = set(arrivals)
    return [(t, seq) for t, seq, _ in logged if (t, seq) not in received]


def order_breaks(arrivals: list[tuple[str, int]]) -> int:
    """Events first received after a later event of the same table (a redelivery is none).

    >>> order_breaks([("t", 1), ("u", 1), ("t", 3), ("t", 2), ("t", 3), ("u", 2), ("t", 4)])
    1
    """
    seen: dict[str, set[int]] = {}
    highest: dict[str, int] = {}
    breaks = 0
    for table_id, seq in arrivals:
        got = seen.setdefault(table_id, set())
        if seq in got:
            continue  # a redelivery: at-least-once
        got.add(seq)
        if seq < highest.get(table_id, 0):
            breaks += 1
        highest[table_id] = max(highest.get(table_id, 0), seq)
    return breaks


def non_json_lines(paths: list[Path]) -> tuple[int, list[str]]:
    """Lines that are not one JSON object, and the first few of them."""
    count, examples = 0, []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                ok = isinstance(json.loads(line), dict)
            except ValueError:
                ok = False
            if not ok:
                count += 1
                if len(examples) < 5:
                    examples.append(f"{path.name}: {line[:200]}")
    return count, examples


async def main() -> int:
    # The driver's own broker client (the subscriber) reconnects through the outage quietly.
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    random.seed(int(os.environ.get("CHAOS_SEED", "0")) or None)
    people = int(os.environ.get("CHAOS_PEOPLE_MATCHES", "2"))
    bots = int(os.environ.get("CHAOS_BOT_MATCHES", "3"))
    gap_s = float(os.environ.get("CHAOS_GAP_S", "8"))
    run_dir = Path(os.environ.get("CHAOS_DIR", ROOT / ".run" / "chaos")) / time.strftime(
        "%Y%m%dT%H%M%S"
    )
    run_dir.mkdir(parents=True)
    log(f"servers and logs under {run_dir}")
    state_dir = run_dir / "servers"
    began = time.monotonic()
    fleet = subscriber = None
    try:
        postgres = Postgres(state_dir, os.environ.get("CHAOS_SYNCHRONOUS_COMMIT", "on"))
        rabbit = Rabbit(state_dir)
        admin = postgres.entry.url
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute("CREATE DATABASE gin")
        finally:
            await conn.close()
        db_url = admin.rsplit("/", 1)[0] + "/gin"
        settings = chaos_settings(db_url, rabbit.entry.url)
        subscriber = Subscriber()
        await subscriber.start(rabbit.entry.url)  # bound before the first table
        fleet = Fleet(settings, run_dir)
        for name in MODULES:
            fleet.start(name)
        await wait_ready(fleet)
        log("every service is ready; playing")

        ledger = Ledger()
        stop = asyncio.Event()
        tables = [fleet.base("table-a"), fleet.base("table-b")]
        chat = fleet.base("chat")
        async with aiohttp.ClientSession() as session:

            def people_factory() -> Callable[[], Awaitable[None]]:
                return lambda: people_match(
                    [Player(session, tables, ledger), Player(session, tables, ledger)],
                    chat,
                    ledger,
                )

            def bot_factory() -> Callable[[], Awaitable[None]]:
                return lambda: bot_match(Player(session, tables, ledger), chat, ledger)

            workers = [
                asyncio.create_task(keep_playing(people_factory(), stop, ledger))
                for _ in range(people)
            ] + [
                asyncio.create_task(keep_playing(bot_factory(), stop, ledger)) for _ in range(bots)
            ]

            async def kill(name: str) -> None:
                fleet.kill(name)
                await asyncio.sleep(2)
                fleet.start(name)

            async def pg(how: signal.Signals) -> None:
                await asyncio.to_thread(postgres.stop, how)
                await asyncio.sleep(3)
                await asyncio.to_thread(postgres.start)

            async def broker_stopped() -> None:
                await asyncio.to_thread(rabbit.ctl, "stop_app")
                await asyncio.sleep(10)
                await asyncio.to_thread(rabbit.ctl, "start_app")

            faults: list[tuple[str, Callable[[], Awaitable[None]]]] = [
                ("kill -9 table-a", lambda: kill("table-a")),
                ("kill -9 bots", lambda: kill("bots")),
                ("postgresql fast restart", lambda: pg(signal.SIGINT)),
                ("kill -9 table-b", lambda: kill("table-b")),
                ("kill -9 chat", lambda: kill("chat")),
                ("postgresql immediate restart", lambda: pg(signal.SIGQUIT)),
                ("kill -9 timers", lambda: kill("timers")),
                ("rabbitmq stopped 10 s", broker_stopped),
            ]
            applied = []
            await asyncio.sleep(gap_s)
            for name, fault in faults:
                log(f"fault: {name}")
                await fault()
                await wait_ready(fleet)
                applied.append(name)
                await asyncio.sleep(gap_s)
            stop.set()
            log("faults done; the matches under way play to their end")
            _, pending = await asyncio.wait(workers, timeout=DRAIN_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        drained = await outbox_drained(db_url)
        await subscriber.quiet(for_s=3.0, within_s=60.0)

        conn = await asyncpg.connect(db_url)
        try:
            events = await conn.fetch(
                "SELECT table_id, seq, (envelope->>'version')::int AS version FROM gin_table.events"
            )
            commands = await conn.fetch("SELECT table_id, command_id FROM gin_table.commands")
            statuses = dict(await conn.fetch("SELECT table_id, status FROM gin_table.tables"))
        finally:
            await conn.close()
        logged = [(r["table_id"], r["seq"], r["version"]) for r in events]
        known = {(r["table_id"], r["command_id"]) for r in commands}
        lost = lost_moves(ledger.acknowledged, known, logged)
        missed = missed_events(logged, subscriber.arrivals)
        connection = await aio_pika.connect(rabbit.entry.url)
        async with connection:
            channel = await connection.channel()
            dead = await channel.declare_queue(PREFIX + "gin.dead", passive=True)
            dead_lettered = dead.declaration_result.message_count or 0
        stuck = sorted(t for t in ledger.started if statuses.get(t) not in DONE) + sorted(
            ledger.stuck - {t for t in ledger.started if statuses.get(t) in DONE}
        )
        fleet.stop()
        bad_lines, examples = non_json_lines(fleet.logs)
        report = {
            "acknowledged_moves_lost": len(lost),
            "events_missed": len(missed),
            "order_breaks": order_breaks(subscriber.arrivals),
            "dead_lettered": dead_lettered,
            "stuck_matches": len(set(stuck)),
            "non_json_log_lines": bad_lines,
            "faults": applied,
            "matches_started": len(ledger.started),
            "matches_over": sum(1 for t in ledger.started if statuses.get(t) in DONE),
            "people_matches": sum(1 for k in ledger.started.values() if k == "people"),
            "moves_acknowledged": len(ledger.acknowledged),
            "events_logged": len(events),
            "events_received": len(subscriber.arrivals),
            "outbox_drained": drained,
            "answers": {str(k): v for k, v in sorted(ledger.answers.items())},
            "unexpected_answers": [f"{s}: {str(b)[:200]}" for s, b in ledger.unexpected[:10]],
            "examples": {
                "lost": lost[:5],
                "missed": missed[:5],
                "stuck": sorted(set(stuck))[:5],
                "non_json": examples,
            },
            "seconds": round(time.monotonic() - began, 1),
            "logs": str(run_dir),
        }
        print(json.dumps(report), flush=True)
        zeros = (
            "acknowledged_moves_lost",
            "events_missed",
            "order_breaks",
            "dead_lettered",
            "stuck_matches",
            "non_json_log_lines",
        )
        failed = [k for k in zeros if report[k]] + ([] if drained else ["outbox_drained"])
        if ledger.unexpected:
            failed.append("unexpected_answers")
        log("all zeros" if not failed else f"NOT zero: {', '.join(failed)}")
        return 1 if failed else 0
    finally:
        if subscriber is not None:
            with contextlib.suppress(Exception):
                await subscriber.close()
        if fleet is not None:
            fleet.stop()
        # Both servers stopped (only ours), their data deleted; the services' logs stay.
        servers.stop(state_dir, purge=True)
