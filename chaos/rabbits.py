"""A RabbitMQ cluster of three nodes on this machine, throwaway, for ``make chaos-cluster`` and
tests/infra/test_broker_cluster.py: production's RabbitmqCluster (three nodes, quorum queues
and the history stream replicated on each) with nodes that can be stopped and started.

Each node is Debian's rabbitmq-server run as ``scripts/servers.py`` runs its single node (its
own name, AMQP and distribution ports, data and logs under ``state_dir/<node>``), but the three
share one epmd (they find each other through it) and one Erlang cookie (written into each
node's HOME). They start at once; the second and third then ``join_cluster`` the first.
Plugins stay off. ``stop()`` stops every node of ours and our epmd, and deletes ``state_dir``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import shutil
import signal
import time
from pathlib import Path

from scripts import servers

# Three nodes booting at once on a small machine, each far slower than one booting alone.
START_TIMEOUT_S = 180.0


class RabbitCluster:
    """Three RabbitMQ nodes on this machine clustered (throwaway, under state_dir)."""

    def __init__(self, state_dir: Path, nodes: int = 3) -> None:
        self.state_dir = state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.owner = servers.owner_of(self.state_dir)
        self.bindir = servers.rabbit_bindir(servers.Installer())
        self.cookie = secrets.token_hex(16)
        ports = servers.free_ports(2 * nodes + 1)
        self.epmd_port = ports[-1]
        self.entries: list[servers.RabbitState] = []
        for index in range(nodes):
            root = self.state_dir / f"node{index + 1}"
            port, dist_port = ports[2 * index], ports[2 * index + 1]
            self.entries.append(
                servers.RabbitState(
                    root=str(root),
                    nodename=f"gin{index + 1}@localhost",
                    port=port,
                    dist_port=dist_port,
                    epmd_port=self.epmd_port,
                    url=f"amqp://guest:guest@{servers.LOCALHOST}:{port}/",
                )
            )
        self.epmd_pid: int | None = None
        began = time.monotonic()
        try:
            self._start_epmd()
            for entry in self.entries:
                self._prepare(entry)
                self._spawn(entry)
            with concurrent.futures.ThreadPoolExecutor(len(self.entries)) as pool:
                list(pool.map(self._await_startup, self.entries))
            self.boot_s = time.monotonic() - began
            first = self.entries[0].nodename
            for entry in self.entries[1:]:
                self.ctl(entry.nodename, "stop_app")
                self.ctl(entry.nodename, "join_cluster", first)
                self.ctl(entry.nodename, "start_app")
            self._await_members(len(self.entries))
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - began
        servers.log(
            f"rabbitmq cluster: {nodes} nodes on ports {[e.port for e in self.entries]} in"
            f" {self.start_s:.1f} s (booted in {self.boot_s:.1f} s); data in {self.state_dir}"
        )

    # --- what the harness and the tests use --------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """One AMQP URL per node, in order."""
        return [entry.url for entry in self.entries]

    @property
    def url(self) -> str:
        """The services' ``GIN_AMQP_URL`` naming every node: one URL with every host:port
        (``shared.infra.amqp.node_urls`` reads it)."""
        hosts = ",".join(f"{servers.LOCALHOST}:{entry.port}" for entry in self.entries)
        return f"amqp://guest:guest@{hosts}/"

    def names(self) -> list[str]:
        """The node names, in order (``gin1@localhost``, ...)."""
        return [entry.nodename for entry in self.entries]

    def node_of_port(self, port: int) -> str:
        """The node listening for AMQP on ``port``."""
        return next(entry.nodename for entry in self.entries if entry.port == port)

    def leader_of(self, queue: str, vhost: str = "/") -> str:
        """The node leading a quorum queue or stream, asked of a running node."""
        for row in self.queues(vhost):
            if row["name"] == queue:
                leader = row.get("leader")
                if not leader or leader == "''":
                    raise RuntimeError(f"{queue!r} has no leader now: {row}")
                return str(leader)
        raise KeyError(f"no queue {queue!r} in vhost {vhost!r}")

    def queues(self, vhost: str = "/") -> list[dict[str, object]]:
        """Every queue of a vhost: name, type, leader, members and online members (a
        classic queue has none of the last three)."""
        out = self.ctl(
            self._running(),
            "list_queues",
            "-p",
            vhost,
            "name",
            "type",
            "leader",
            "members",
            "online",
            "--formatter",
            "json",
            "--quiet",
        )
        rows: list[dict[str, object]] = json.loads(out or "[]")
        return rows

    def stop_node(self, name: str) -> None:
        """Stop the RabbitMQ application of one node (its Erlang VM stays, as with
        ``rabbitmqctl stop_app``): its clients lose their connections, its queue members
        stop, and the cluster elects new leaders where it led."""
        self.ctl(name, "stop_app")

    def kill_node(self, name: str) -> None:
        """Kill one node's Erlang VM (SIGKILL, as a machine lost): no goodbye to its clients
        or its peers, which notice the lost connections (the peers within a few seconds)."""
        entry = self._entry(name)
        pids = servers.rabbit_owned_pids(entry, self.owner)
        for pid in pids:
            servers.send_signal(pid, signal.SIGKILL)
        servers.wait_gone(pids, 30)

    def start_node(self, name: str) -> None:
        """Start a stopped node's application again (its VM too, if it was killed): it
        rejoins the cluster; return once it runs and each quorum queue and stream counts it
        among its online members."""
        entry = self._entry(name)
        if servers.pid_alive(entry.beam_pid) or servers.pid_alive(entry.script_pid):
            self.ctl(name, "start_app")
        else:  # its data remembers the cluster: it rejoins as it boots
            self._spawn(entry)
            self._await_startup(entry)
        self.ctl(name, "await_startup", "--timeout", "120")
        deadline = time.monotonic() + 60
        while True:
            lagging = [
                row["name"]
                for vhost in self._vhosts()
                for row in self.queues(vhost)
                if name in _names(row.get("members")) and name not in _names(row.get("online"))
            ]
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}'s members of {lagging} are not back after 60 s")
            time.sleep(0.5)

    def ctl(self, name: str, *args: str) -> str:
        """``rabbitmqctl -n name args`` (as that node's environment has it); its output."""
        entry = self._entry(name)
        result = servers.run(
            [str(self.bindir / "rabbitmqctl"), "-n", entry.nodename, *args],
            env=servers.rabbit_env(entry, self.owner),
            cwd=Path(entry.root),
            timeout=180,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args)} on {name}: {servers.output_of(result)}"
            )
        return result.stdout

    def stop(self) -> None:
        """Stop every node of ours and our epmd; delete ``state_dir`` (only ours)."""
        for entry in self.entries:
            if servers.rabbit_owned_pids(entry, self.owner):
                entry.epmd_pid = None  # the shared epmd is stopped last, below
                servers.stop_rabbitmq(entry, self.owner)
        if self.epmd_pid and servers.owned_by(self.epmd_pid, self.owner, "epmd"):
            servers.send_signal(self.epmd_pid, signal.SIGTERM)
            if not servers.wait_gone([self.epmd_pid], 10):
                servers.send_signal(self.epmd_pid, signal.SIGKILL)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # --- inside ------------------------------------------------------------------------------

    def _entry(self, name: str) -> servers.RabbitState:
        for entry in self.entries:
            if name in (entry.nodename, entry.nodename.split("@")[0]):
                return entry
        raise KeyError(f"no node {name!r} in {self.names()}")

    def _running(self) -> str:
        """A node whose application runs (to ask about the cluster)."""
        for entry in self.entries:
            if servers.amqp_answers(servers.LOCALHOST, entry.port, timeout=1.0):
                return entry.nodename
        raise RuntimeError("no node of the cluster runs")

    def _vhosts(self) -> list[str]:
        out = self.ctl(self._running(), "list_vhosts", "name", "--formatter", "json", "--quiet")
        return [str(row["name"]) for row in json.loads(out or "[]")]

    def _start_epmd(self) -> None:
        log_dir = self.state_dir / "epmd"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**servers.rabbit_env(self.entries[0], self.owner)}
        self.epmd_pid = servers.spawn_detached(
            [servers.find_epmd(), "-port", str(self.epmd_port), "-address", servers.LOCALHOST],
            env,
            log_dir,
            log_dir / "epmd.log",
        )
        deadline = time.monotonic() + 10
        while not servers.tcp_open(servers.LOCALHOST, self.epmd_port, 0.5):
            if not servers.pid_alive(self.epmd_pid) or time.monotonic() > deadline:
                raise servers.ServerError(f"epmd did not start on port {self.epmd_port}")
            time.sleep(0.05)

    def _prepare(self, entry: servers.RabbitState) -> None:
        root = Path(entry.root)
        for sub in ("home", "mnesia", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        cookie = root / "home" / ".erlang.cookie"
        cookie.write_text(self.cookie)
        os.chmod(cookie, 0o400)
        servers.write_rabbit_config(root, entry.port)

    def _spawn(self, entry: servers.RabbitState) -> None:
        root = Path(entry.root)
        entry.script_pid = servers.spawn_detached(
            [str(self.bindir / "rabbitmq-server")],
            servers.rabbit_env(entry, self.owner),
            root,
            root / "log" / "server.log",
        )

    def _await_startup(self, entry: servers.RabbitState) -> None:
        log_file = Path(entry.root) / "log" / "server.log"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not servers.amqp_answers(servers.LOCALHOST, entry.port):
            if not servers.pid_alive(entry.script_pid):
                raise servers.ServerError(
                    f"{entry.nodename} exited while starting:\n{servers.tail(log_file)}"
                )
            if time.monotonic() > deadline:
                raise servers.ServerError(
                    f"{entry.nodename} did not answer within {START_TIMEOUT_S:.0f} s:\n"
                    f"{servers.tail(log_file)}"
                )
            time.sleep(0.2)
        self.ctl(entry.nodename, "await_startup", "--timeout", str(int(START_TIMEOUT_S)))
        entry.beam_pid = servers.read_pid_file(Path(entry.root) / "rabbitmq.pid")

    def _await_members(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while True:
            out = self.ctl(self.entries[0].nodename, "cluster_status", "--formatter", "json")
            status = json.loads(out)
            if len(status.get("running_nodes", [])) >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not form: {status}")
            time.sleep(0.5)


def _names(value: object) -> list[str]:
    """Node names from a list_queues column (a list, or empty for a classic queue)."""
    return [str(v) for v in value] if isinstance(value, list) else []
