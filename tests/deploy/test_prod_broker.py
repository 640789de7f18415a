"""The prod overlay's RabbitMQ access on a real broker (issue 14, part 5).

The vhost, users, permissions and topic permissions rendered from ``deploy/k8s/overlays/prod``
are applied with ``rabbitmqctl`` to a throwaway node (``scripts/servers.py``; never the
machine's broker), and its exchanges, queues and bindings are declared as the Messaging
Topology Operator would. Then every service runs as a process connected as its own user, with
production's names (no prefix): all reach ready, a match against TITO is played to the end
with a spectator's socket and a chat message, and nothing is dead-lettered or refused. Last,
each user tries what it must not do, and the broker refuses it: reading the bots' turns,
publishing table events, reading gin.dead, writing any queue through the default exchange, or
binding another's queue.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import asyncpg
import msgspec
import pytest
import yaml
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import ChannelAccessRefused

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.e2e.processes import Service, all_ready
from tests.moves import sobra_move

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import servers  # noqa: E402

pytestmark = pytest.mark.slow
KUBECTL = shutil.which("kubectl")
SERVICES = ("table", "chat", "timers", "bots")
Obj = dict[str, Any]


def render_prod() -> list[Obj]:
    """``kubectl kustomize deploy/k8s/overlays/prod``, parsed."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: it renders the kustomize overlays")
    done = subprocess.run(
        [KUBECTL, "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / "prod")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


class Broker:
    """A throwaway RabbitMQ node of this module's own, configured with ``rabbitmqctl``."""

    def __init__(self, state_dir: Path) -> None:
        self.entry = servers.start_rabbitmq(
            state_dir, servers.load_state(state_dir), servers.Installer(), 180
        )
        self.owner = servers.owner_of(state_dir)

    def ctl(self, *args: str) -> None:
        result = servers.run(
            [str(servers.RABBIT_BIN_DIR / "rabbitmqctl"), "-n", self.entry.nodename, *args],
            env=servers.rabbit_env(self.entry, self.owner),
            cwd=Path(self.entry.root),
            timeout=120,
        )
        assert result.returncode == 0, servers.output_of(result)

    def url(self, user: str, password: str, vhost: str) -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.entry.port}/{vhost}"

    def stop(self) -> None:
        servers.stop_rabbitmq(self.entry, self.owner)


def apply_access(broker: Broker, objs: list[Obj]) -> tuple[str, dict[str, str]]:
    """Create the vhost, the users (a new password each, as the runbook's Secrets) with their
    tags, permissions and topic permissions; the vhost and each user's password."""
    (vhost,) = [o["spec"]["name"] for o in objs if o["kind"] == "Vhost"]
    broker.ctl("add_vhost", vhost)
    # The operator's own administrator (guest on this node) declares the topology objects.
    broker.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    passwords: dict[str, str] = {}
    for user in [o for o in objs if o["kind"] == "User"]:
        # The runbook's Secret gin-<service>-amqp holds username gin-<service>: the User's name.
        name = user["metadata"]["name"]
        passwords[name] = secrets.token_hex(24)
        broker.ctl("add_user", name, passwords[name])
        broker.ctl("set_user_tags", name, *user["spec"].get("tags", []))
    for permission in [o for o in objs if o["kind"] == "Permission"]:
        spec = permission["spec"]
        granted = spec["permissions"]
        assert spec["vhost"] == vhost
        broker.ctl(
            "set_permissions",
            "-p",
            vhost,
            spec["userReference"]["name"],
            granted["configure"],
            granted["write"],
            granted["read"],
        )
    for topic in [o for o in objs if o["kind"] == "TopicPermission"]:
        spec = topic["spec"]
        granted = spec["permissions"]
        broker.ctl(
            "set_topic_permissions",
            "-p",
            vhost,
            spec["userReference"]["name"],
            granted["exchange"],
            granted["write"],
            granted["read"],
        )
    return vhost, passwords


async def apply_topology(url: str, objs: list[Obj]) -> None:
    """Declare the Exchange, Queue and Binding objects as the topology operator does."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for obj in [o for o in objs if o["kind"] == "Exchange"]:
            spec = obj["spec"]
            await channel.declare_exchange(
                spec["name"], spec["type"], durable=spec["durable"], auto_delete=spec["autoDelete"]
            )
        for obj in [o for o in objs if o["kind"] == "Queue"]:
            spec = obj["spec"]
            arguments = dict(spec.get("arguments", {}))
            if "type" in spec:
                arguments["x-queue-type"] = spec["type"]
            await channel.declare_queue(
                spec["name"],
                durable=spec["durable"],
                auto_delete=spec["autoDelete"],
                arguments=arguments,
            )
        for obj in [o for o in objs if o["kind"] == "Binding"]:
            spec = obj["spec"]
            assert spec["destinationType"] == "queue"
            queue = await channel.get_queue(spec["destination"])
            await queue.bind(spec["source"], spec["routingKey"])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    node = Broker(tmp_path_factory.mktemp("rabbit"))
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
async def database(server_urls: tuple[str, str]) -> AsyncIterator[str]:
    """A database of this test's own (the services' schemas empty), dropped at the end."""
    admin = server_urls[0]
    name = f"gin_prod_broker_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    yield f"{admin.rpartition('/')[0]}/{name}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


# --- the match -----------------------------------------------------------------------------


async def play_against_tito(session: aiohttp.ClientSession, table: str, token: str) -> str:
    """Create a table for one hand, seat TITO and play the person's moves to the end."""
    auth = {"Authorization": f"Bearer {token}"}
    async with session.post(
        f"{table}/v1/tables", json={"options": {"target": 1}}, headers=auth
    ) as r:
        assert r.status == 201, await r.text()
        table_id: str = (await r.json())["table_id"]
    async with session.post(
        f"{table}/v1/tables/{table_id}/bot", json={"level": "tito"}, headers=auth
    ) as r:
        assert r.status == 200, await r.text()
    async with asyncio.timeout(120):
        while True:
            async with session.get(f"{table}/v1/tables/{table_id}", headers=auth) as r:
                assert r.status == 200, await r.text()
                view = await r.json()
            if view["status"] != "playing":
                assert view["status"] == "match_over", view["status"]
                return table_id
            if view["hand"]["to_act"] != 0:
                await asyncio.sleep(0.05)  # the bot's turn
                continue
            move = sobra_move(view)
            body = {**move, "command_id": f"p-{uuid.uuid4().hex[:12]}"}
            async with session.post(
                f"{table}/v1/tables/{table_id}/commands", json=body, headers=auth
            ) as r:
                assert r.status == 200, await r.text()


async def metric(session: aiohttp.ClientSession, base: str, name: str) -> float:
    async with session.get(f"{base}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


# --- what each user must not do --------------------------------------------------------------

Attempt = Callable[[AbstractChannel], Awaitable[object]]


async def publish(channel: AbstractChannel, exchange: str, key: str) -> None:
    target = channel.default_exchange if exchange == "" else await channel.get_exchange(exchange)
    await target.publish(aio_pika.Message(b"{}"), routing_key=key)


async def take(channel: AbstractChannel, queue: str) -> object:
    return await (await channel.get_queue(queue)).get(fail=False)


async def bind(channel: AbstractChannel, queue: str, exchange: str, key: str = "#") -> None:
    await (await channel.get_queue(queue)).bind(exchange, key)


async def own_sockets_queue(channel: AbstractChannel) -> str:
    """A queue named as a table replica's (which the table's user may declare)."""
    queue = await channel.declare_queue(
        f"gin.sockets.{uuid.uuid4().hex}", exclusive=True, auto_delete=True
    )
    return queue.name


def refusals(user: str) -> dict[str, Attempt]:
    """What ``user`` must be refused, by a description."""
    every: dict[str, Attempt] = {
        "write gin.commands through the default exchange": lambda ch: publish(
            ch, "", "gin.commands"
        ),
        "write gin.chat through the default exchange": lambda ch: publish(ch, "", "gin.chat"),
        "write gin.bots.tito through the default exchange": lambda ch: publish(
            ch, "", "gin.bots.tito"
        ),
    }
    not_bots: dict[str, Attempt] = {
        "read gin.bots.tito": lambda ch: take(ch, "gin.bots.tito"),
        "read gin.bots.luna": lambda ch: take(ch, "gin.bots.luna"),
    }
    not_table: dict[str, Attempt] = {
        "read gin.dead": lambda ch: take(ch, "gin.dead"),
        "publish a table event": lambda ch: publish(ch, "gin.events", "table.t1.card_drawn"),
        "read gin.commands": lambda ch: take(ch, "gin.commands"),
    }
    own: dict[str, dict[str, Attempt]] = {
        "gin-table": {
            "bind its queue to gin.bots": lambda ch: bind_new_sockets_queue(ch, "gin.bots"),
            "publish a chat event": lambda ch: publish(ch, "gin.events", "chat.t1.message_posted"),
            "send a command": lambda ch: publish(ch, "gin.commands.in", "gin.commands"),
            **not_bots,
        },
        "gin-chat": {
            "bind its queue to gin.bots": lambda ch: bind(ch, "gin.chat", "gin.bots"),
            "bind gin.commands to gin.events": lambda ch: bind(ch, "gin.commands", "gin.events"),
            "send a command": lambda ch: publish(ch, "gin.commands.in", "gin.commands"),
            "publish a timer event": lambda ch: publish(ch, "gin.events", "timer.t1.expired"),
            **not_bots,
            **not_table,
        },
        "gin-timers": {
            "bind gin.chat to gin.bots": lambda ch: bind(ch, "gin.chat", "gin.bots"),
            "read gin.chat": lambda ch: take(ch, "gin.chat"),
            "bind gin.commands to gin.events": lambda ch: bind(ch, "gin.commands", "gin.events"),
            "publish a chat event": lambda ch: publish(ch, "gin.events", "chat.t1.message_posted"),
            **not_bots,
            **not_table,
        },
        "gin-bots": {
            "bind gin.commands to gin.bots": lambda ch: bind(ch, "gin.commands", "gin.bots"),
            "publish a turn": lambda ch: publish(ch, "gin.bots", "bot.tito"),
            **not_table,
        },
        "gin-keda": {**not_bots, **not_table},
    }
    return {**every, **own[user]}


async def bind_new_sockets_queue(channel: AbstractChannel, exchange: str) -> None:
    await bind(channel, await own_sockets_queue(channel), exchange)


async def refused(connection: AbstractConnection, attempt: Attempt) -> bool:
    """True when the broker refuses the attempt (ACCESS_REFUSED), on a channel of its own."""
    channel = await connection.channel(publisher_confirms=True)
    try:
        await attempt(channel)
    except ChannelAccessRefused:
        return True
    finally:
        if not channel.is_closed:
            await channel.close()
    return False


def user_of(workload: str, passwords: dict[str, str]) -> tuple[str, str]:
    """The broker user and password a workload connects as (table.relay: the table's)."""
    user = "gin-" + workload.partition(".")[0]
    return user, passwords[user]


# --- the test --------------------------------------------------------------------------------


async def test_every_service_plays_as_its_own_user_and_is_refused_the_rest(
    broker: Broker, settings: Settings, database: str, tmp_path: Path
) -> None:
    objs = render_prod()
    vhost, passwords = await asyncio.to_thread(apply_access, broker, objs)
    assert set(passwords) == {f"gin-{s}" for s in SERVICES} | {"gin-keda"}
    await apply_topology(broker.url("guest", "guest", vhost), objs)

    s = msgspec.structs.replace(
        settings,
        database_url=database,
        prefix="",  # production's names: the permissions' patterns are anchored on them
        log_format="json",
        bot_think_s=0.0,
        relay_apart=True,  # as prod runs the table: its outbox relay a process of its own
    )
    # Each service as its user; the table's relay (table.relay) is the table's code and user.
    workloads = (*SERVICES, "table.relay")
    logs = {name: tmp_path / f"{name}.log" for name in workloads}
    services = {
        name: Service(
            f"services.{name}",
            msgspec.structs.replace(s, amqp_url=broker.url(*user_of(name, passwords), vhost)),
            log_to=logs[name],
            GIN_LOG_LEVEL="info",
        )
        for name in workloads
    }
    try:
        await all_ready(services, logs, within_s=90)
        table, chat = services["table"].base, services["chat"].base
        async with aiohttp.ClientSession() as session:
            token = mint(s.auth_secret, f"ana-{uuid.uuid4().hex}", "Ana")
            table_id = await play_against_tito(session, table, token)
            # The chat learnt the seat from the table's events (its own queue, its own user)
            # and publishes the message; a spectator's socket gets it through the replica's
            # queue (gin.sockets.<hex>, the table's user).
            async with session.ws_connect(f"{table}/v1/tables/{table_id}/ws") as ws:
                snapshot = await ws.receive_json(timeout=10)
                assert snapshot["kind"] == "snapshot"
                async with session.post(
                    f"{chat}/v1/tables/{table_id}/messages",
                    json={"text": "boa partida"},
                    headers={"Authorization": f"Bearer {token}"},
                ) as r:
                    assert r.status == 201, await r.text()
                async with asyncio.timeout(20):
                    while "boa partida" not in json.dumps(await ws.receive_json()):
                        pass
            # The timers' firing loop ran (it reads the table's deadlines; it consumes no queue).
            timers = await session.get(f"{services['timers'].base}/metrics")
            assert "gin_timer_deadlines_pending" in await timers.text()

        # Nothing dead-lettered; gin.dead is the table's to read.
        table_user = await aio_pika.connect(broker.url("gin-table", passwords["gin-table"], vhost))
        async with table_user:
            channel = await table_user.channel()
            assert await (await channel.get_queue("gin.dead")).get(fail=False) is None

        failures: list[str] = []
        for user, password in passwords.items():
            connection = await aio_pika.connect(broker.url(user, password, vhost))
            async with connection:
                for what, attempt in refusals(user).items():
                    if not await refused(connection, attempt):
                        failures.append(f"{user} may {what}")
        assert not failures, failures
    finally:
        for service in services.values():
            service.stop()
    for name, path in logs.items():
        text = path.read_text()
        assert "ACCESS_REFUSED" not in text, f"{name} was refused: {text[-2000:]}"
        for line in text.splitlines():
            json.loads(line)  # every line JSON
