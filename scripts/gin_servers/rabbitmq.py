"""A throwaway RabbitMQ node under a state dir, kept apart from the machine's own broker.

``/usr/lib/rabbitmq/bin/rabbitmq-server`` runs directly (the ``/usr/sbin`` wrapper switches
user and writes to /var/log), with its own epmd, ports, data, logs and configuration, every
one named in its environment (``rabbit_env``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import signal
import time
from pathlib import Path

from gin_servers.amqp import amqp_answers, standard_amqp_url
from gin_servers.common import (
    LOCALHOST,
    OWNER_ENV,
    Installer,
    ServerError,
    free_ports,
    log,
    output_of,
    owned_by,
    pid_alive,
    prepare_dir,
    read_pid_file,
    redact,
    run,
    send_signal,
    spawn_detached,
    tail,
    tcp_open,
    wait_gone,
)
from gin_servers.state import RabbitState, State, owner_of, save_state

RABBIT_BIN_DIR = Path("/usr/lib/rabbitmq/bin")


def rabbit_bindir(installer: Installer) -> Path:
    if not os.access(RABBIT_BIN_DIR / "rabbitmq-server", os.X_OK):
        installer.install(["rabbitmq-server"], "RabbitMQ is missing")
    for exe in ("rabbitmq-server", "rabbitmqctl"):
        if not os.access(RABBIT_BIN_DIR / exe, os.X_OK):
            raise ServerError(f"{RABBIT_BIN_DIR / exe} is missing even after apt-get")
    return RABBIT_BIN_DIR


def find_epmd() -> str:
    found = shutil.which("epmd")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))
    if not candidates:
        raise ServerError("epmd (Erlang) is missing; reinstall the rabbitmq-server package")
    return candidates[-1]


def rabbit_env(entry: RabbitState, owner: str) -> dict[str, str]:
    """The environment for rabbitmq-server and rabbitmqctl: everything the node reads or
    writes under its root, and nothing of the machine's own broker.

    HOME holds the Erlang cookie (rabbitmqctl needs the same HOME to reach the node); the
    distribution port is set because its default (the AMQP port + 20000) is out of range for
    a high port; epmd gets a port of its own (not the shared 4369), on the loopback address,
    as does the distribution. The machine's RABBITMQ_* and ERL_* settings are left out.
    """
    root = Path(entry.root)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RABBITMQ_", "ERL_")) and k not in ("HOME", "NOTIFY_SOCKET")
    }
    env.update(
        {
            OWNER_ENV: owner,
            "HOME": str(root / "home"),
            "RABBITMQ_NODENAME": entry.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": LOCALHOST,
            "RABBITMQ_NODE_PORT": str(entry.port),
            "RABBITMQ_DIST_PORT": str(entry.dist_port),
            "ERL_EPMD_PORT": str(entry.epmd_port),
            "ERL_EPMD_ADDRESS": LOCALHOST,
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_PID_FILE": str(root / "rabbitmq.pid"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_CRASH_DUMP": str(root / "log" / "erl_crash.dump"),
        }
    )
    return env


def rabbit_owned_pids(entry: RabbitState, owner: str) -> list[int]:
    home = str(Path(entry.root) / "home")
    pids = [entry.script_pid, entry.beam_pid, read_pid_file(Path(entry.root) / "rabbitmq.pid")]
    found: list[int] = []
    for pid in pids:
        if pid and pid not in found and owned_by(pid, owner, home):
            found.append(pid)
    return found


def epmd_owned(entry: RabbitState, owner: str) -> bool:
    return owned_by(entry.epmd_pid, owner, "epmd", f"-port {entry.epmd_port}")


def write_rabbit_config(root: Path, port: int) -> None:
    """A node's own configuration under ``root``: AMQP on ``port`` at the loopback address,
    logs to the console, no plugins, and nothing read from /etc/rabbitmq."""
    (root / "rabbitmq.conf").write_text(
        "# Written by scripts/servers.py on every start.\n"
        f"listeners.tcp.default = {LOCALHOST}:{port}\n"
        "loopback_users = none\n"
        "log.console = true\n"
        "log.file = false\n"
    )
    (root / "enabled_plugins").write_text("[].\n")
    (root / "rabbitmq-env.conf").write_text("# Empty: keeps /etc/rabbitmq/rabbitmq-env.conf out.\n")


def _await_epmd(entry: RabbitState, root: Path) -> None:
    deadline = time.monotonic() + 10
    while not tcp_open(LOCALHOST, entry.epmd_port, 0.5):
        if not pid_alive(entry.epmd_pid) or time.monotonic() > deadline:
            raise ServerError(
                f"epmd did not start on port {entry.epmd_port}: {tail(root / 'log' / 'epmd.log')}"
            )
        time.sleep(0.05)


def _await_node(
    entry: RabbitState, bindir: Path, env: dict[str, str], deadline: float, timeout: float
) -> None:
    """Wait until the node answers AMQP, then until rabbitmqctl says it has started."""
    root = Path(entry.root)
    log_file = root / "log" / "server.log"
    while not amqp_answers(LOCALHOST, entry.port):
        if not pid_alive(entry.script_pid):
            raise ServerError(f"rabbitmq-server exited while starting:\n{tail(log_file)}")
        if time.monotonic() > deadline:
            raise ServerError(
                f"RabbitMQ did not answer on port {entry.port} within {timeout:.0f} s:\n"
                f"{tail(log_file)}"
            )
        time.sleep(0.2)
    remaining = max(10.0, deadline - time.monotonic())
    ctl = [str(bindir / "rabbitmqctl"), "-n", entry.nodename, "await_startup"]
    result = run(
        [*ctl, "--timeout", str(int(remaining))], env=env, cwd=root, timeout=remaining + 30
    )
    if result.returncode != 0:
        raise ServerError(f"rabbitmqctl await_startup failed: {output_of(result)}")


def start_rabbitmq(
    state_dir: Path, state: State, installer: Installer, timeout: float
) -> RabbitState:
    """A throwaway node under ``state_dir``/rabbitmq (its data kept for the next start), on
    the ports it had when they are still free; returns once the node has started."""
    bindir = rabbit_bindir(installer)
    epmd = find_epmd()
    owner = owner_of(state_dir)
    root = state_dir / "rabbitmq"
    for sub in ("home", "mnesia", "log"):
        prepare_dir(root / sub, None)
    previous = state.rabbitmq
    port, dist_port, epmd_port = free_ports(
        3,
        [previous.port, previous.dist_port, previous.epmd_port] if previous else [],
    )
    digest = hashlib.sha256(owner.encode()).hexdigest()[:8]
    entry = RabbitState(
        root=str(root),
        nodename=f"gin-{digest}@localhost",
        port=port,
        dist_port=dist_port,
        epmd_port=epmd_port,
        url=f"amqp://guest:guest@{LOCALHOST}:{port}/",
    )
    write_rabbit_config(root, port)
    with contextlib.suppress(FileNotFoundError):
        (root / "rabbitmq.pid").unlink()
    env = rabbit_env(entry, owner)
    log_file = root / "log" / "server.log"

    began = time.monotonic()
    # Our own epmd, started first and in the foreground, so its pid is known and stop can end
    # it; the node's own `epmd -daemon` then finds the port taken and exits.
    entry.epmd_pid = spawn_detached(
        [epmd, "-port", str(epmd_port), "-address", LOCALHOST], env, root, root / "log" / "epmd.log"
    )
    state.rabbitmq = entry
    save_state(state_dir, state)
    _await_epmd(entry, root)

    entry.script_pid = spawn_detached([str(bindir / "rabbitmq-server")], env, root, log_file)
    save_state(state_dir, state)
    _await_node(entry, bindir, env, began + timeout, timeout)
    entry.beam_pid = read_pid_file(root / "rabbitmq.pid")
    entry.start_s = time.monotonic() - began
    save_state(state_dir, state)
    return entry


def stop_rabbitmq(entry: RabbitState, owner: str) -> None:
    pids = rabbit_owned_pids(entry, owner)
    if pids:
        ctl = RABBIT_BIN_DIR / "rabbitmqctl"
        if os.access(ctl, os.X_OK):
            result = run(
                [str(ctl), "-n", entry.nodename, "stop"],
                env=rabbit_env(entry, owner),
                cwd=Path(entry.root),
                timeout=90,
            )
            if result.returncode != 0:
                log(f"rabbitmq: rabbitmqctl stop failed ({output_of(result)}); using SIGTERM")
        if not wait_gone(pids, 30):
            for pid in pids:
                if owned_by(pid, owner, str(Path(entry.root) / "home")):
                    send_signal(pid, signal.SIGTERM)
            if not wait_gone(pids, 30):
                for pid in pids:
                    if owned_by(pid, owner, str(Path(entry.root) / "home")):
                        send_signal(pid, signal.SIGKILL)
                wait_gone(pids, 10)
        log(f"rabbitmq: stopped node {entry.nodename} (port {entry.port})")
    else:
        log(f"rabbitmq: no node of ours is running on port {entry.port}")
    if entry.epmd_pid and epmd_owned(entry, owner):
        send_signal(entry.epmd_pid, signal.SIGTERM)
        if not wait_gone([entry.epmd_pid], 10):
            send_signal(entry.epmd_pid, signal.SIGKILL)
            wait_gone([entry.epmd_pid], 5)
        log(f"rabbitmq: stopped epmd pid {entry.epmd_pid} (port {entry.epmd_port})")


def reuse_rabbitmq(entry: RabbitState, owner: str, timeout: float) -> bool:
    if not rabbit_owned_pids(entry, owner):
        if epmd_owned(entry, owner):
            stop_rabbitmq(entry, owner)  # a leftover epmd of a node that died
        return False
    deadline = time.monotonic() + timeout
    while not amqp_answers(LOCALHOST, entry.port):
        if time.monotonic() > deadline or not rabbit_owned_pids(entry, owner):
            log("rabbitmq: our previous node runs but does not answer; restarting it")
            stop_rabbitmq(entry, owner)
            return False
        time.sleep(0.5)
    return True


def ensure_rabbitmq(
    state_dir: Path, state: State, installer: Installer, *, throwaway: bool, timeout: float
) -> str:
    """A broker's URL: our running throwaway node, else (unless ``throwaway``) the standard
    port's broker, else a new throwaway node."""
    rabbit = state.rabbitmq
    if rabbit and reuse_rabbitmq(rabbit, owner_of(state_dir), timeout):
        log(f"rabbitmq: reusing our throwaway node on port {rabbit.port}")
        return rabbit.url
    if not throwaway and (url := standard_amqp_url()):
        log(f"rabbitmq: using the server on the standard port ({redact(url)})")
        return url
    rabbit = start_rabbitmq(state_dir, state, installer, timeout)
    log(
        f"rabbitmq: throwaway node started on port {rabbit.port} "
        f"(beam pid {rabbit.beam_pid}) in {rabbit.start_s or 0:.2f} s; "
        f"data in {rabbit.root}"
    )
    return rabbit.url
