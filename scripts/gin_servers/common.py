"""What both servers need: errors and messages, processes and ports, short commands, and
Debian's packages (installed with apt-get when a server's binaries are missing)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import pwd
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

DATABASE_ENV = "GIN_DATABASE_URL"
AMQP_ENV = "GIN_AMQP_URL"
OWNER_ENV = "GIN_SERVERS_OWNER"
LOCALHOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 120.0


class ServerError(Exception):
    """Something could not be done; the message says what, and what to do about it."""


def log(message: str) -> None:
    print(f"servers: {message}", file=sys.stderr, flush=True)


def redact(url: str) -> str:
    """The URL with its password replaced by ***, for messages (a multi-host URL too)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


PORT_LOCKS = Path(tempfile.gettempdir()) / "gin-ports"
"""One lock file a port: who holds its flock owns the port (any process, any checkout)."""
PORT_FLOOR = 20000
"""Ports are handed out from here up to the kernel's ephemeral range, which bind(0) and
outgoing connections draw from; below the floor lie servers' usual ports (RabbitMQ's 15672)."""
_held: dict[int, int] = {}


@functools.cache
def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOCALHOST, port))
        except OSError:
            return False
    return True


@functools.cache
def _port_locks() -> Path:
    """The lock folder, made once a process (a failure is not cached: the next port retries)."""
    PORT_LOCKS.mkdir(mode=0o1777, exist_ok=True)
    if PORT_LOCKS.stat().st_uid == os.geteuid():
        PORT_LOCKS.chmod(0o1777)  # every user's runs share the reservations
    return PORT_LOCKS


def _reserve(port: int) -> bool:
    """Take ``port`` for this process until it exits: its lock file's flock, then a bind."""
    if port in _held:
        return False
    try:
        fd = os.open(_port_locks() / str(port), os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    if not _bindable(port):
        os.close(fd)
        return False
    _held[port] = fd
    return True


def free_ports(count: int, preferred: Sequence[int | None] = ()) -> list[int]:
    """Distinct ports on 127.0.0.1 that nothing listens on; a preferred one when still free.

    A port from bind(0) is only free until someone else binds it: another test worker's bind(0)
    can return it before our child listens, and a child that then fails to bind leaves the other
    process answering on "our" port. So each port is reserved instead: outside the ephemeral
    range, under a flock that this process holds until it exits, and checked with a bind.
    """
    low, high = PORT_FLOOR, min(_ephemeral_low(), 65536)
    if high - low < 1000:  # an ephemeral range moved down to the floor: share it, locked
        high = 65536
    span = high - low
    start = random.randrange(span) if span > 0 else 0
    ports: list[int] = []
    tried = 0
    for index in range(count):
        wanted = preferred[index] if index < len(preferred) else None
        if wanted and (_bindable(wanted) if wanted in _held else _reserve(wanted)):
            ports.append(wanted)  # a restarted server keeps its port, so its clients find it
            continue
        while True:
            if tried >= span:
                raise ServerError(
                    f"no free port in {low}-{high - 1}: each is listened on or reserved by a "
                    f"running process (a flock on its file in {PORT_LOCKS}, a folder this user "
                    "must be able to write); stop leftover servers and test runs"
                )
            port = low + (start + tried) % span
            tried += 1
            if _reserve(port):
                ports.append(port)
                break
    return ports


def free_port() -> int:
    """One port of :func:`free_ports`."""
    return free_ports(1)[0]


def pid_alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie (reaping it when it is our child)."""
    if not pid or pid <= 0:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def owned_by(pid: int | None, owner: str, *needles: str) -> bool:
    """True when pid is alive and was started by this script for this state dir.

    The proof is ``GIN_SERVERS_OWNER=<owner>`` in its environment or, for a process whose
    environment cannot be read or was rewritten, every needle in its command line.
    """
    if not pid or not pid_alive(pid):
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    if f"{OWNER_ENV}={owner}".encode() in environ:
        return True
    if not needles:
        return False
    cmdline = " ".join(proc_cmdline(pid))
    return all(needle in cmdline for needle in needles)


def wait_gone(pids: Sequence[int | None], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return not any(pid_alive(pid) for pid in pids)


def send_signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def spawn_detached(argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> int:
    """Start argv in its own session, stdout and stderr appended to log_path; return its pid.

    The process outlives this one (no Popen object to warn about it), and ``sh -c 'cd ...;
    exec ...'`` keeps the pid that of argv[0] while setting its working directory.
    """
    file_actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(
        "/bin/sh",
        ["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv],
        dict(env),
        file_actions=file_actions,
        setsid=True,
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM),
    )


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run a short command, capturing its output; a missing program or timeout is an error."""
    try:
        return subprocess.run(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ServerError(f"cannot run {argv[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ServerError(f"{shlex.join(argv)} did not finish within {timeout:.0f} s") from exc


def output_of(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stderr.strip() + "\n" + result.stdout.strip()).strip() or "(no output)"


class Installer:
    """Installs Debian packages, running ``apt-get update`` at most once per process."""

    def __init__(self) -> None:
        self.updated = False

    def _prefix(self) -> list[str]:
        if os.geteuid() == 0:
            return []
        sudo = shutil.which("sudo")
        if sudo and run([sudo, "-n", "true"], timeout=10).returncode == 0:
            return [sudo, "-n"]
        raise ServerError(
            "installing Debian packages needs root (or password-less sudo); run as root, "
            "install them yourself, or set GIN_DATABASE_URL and GIN_AMQP_URL"
        )

    def install(self, packages: Sequence[str], why: str) -> None:
        apt_get = shutil.which("apt-get")
        if apt_get is None:
            raise ServerError(
                f"{why}, and apt-get is not available to install {' '.join(packages)}: "
                "install them yourself, or set GIN_DATABASE_URL and GIN_AMQP_URL to running "
                "servers"
            )
        prefix = self._prefix()
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        steps: list[list[str]] = []
        if not self.updated:
            steps.append([*prefix, apt_get, "update"])
        steps.append([*prefix, apt_get, "install", "-y", *packages])
        log(f"{why}: installing {' '.join(packages)} with apt-get")
        for step in steps:
            # Progress goes to stderr: stdout carries only the settings.
            try:
                code = subprocess.run(
                    step, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr, check=False
                ).returncode
            except OSError as exc:
                raise ServerError(f"cannot run {shlex.join(step)}: {exc}") from exc
            if code != 0:
                raise ServerError(
                    f"{shlex.join(step)} failed (exit {code}); install "
                    f"{' '.join(packages)} yourself, or set GIN_DATABASE_URL and GIN_AMQP_URL"
                )
            if "update" in step:
                self.updated = True


def prepare_dir(path: Path, owner: pwd.struct_passwd | None) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
