#!/usr/bin/env python3
"""Make sure a PostgreSQL and a RabbitMQ server are available (standard library only).

Used by ``make dev`` and ``make test``::

    python scripts/servers.py ensure --state-dir .run/servers --env-file .run/servers.env
    . .run/servers.env          # export GIN_DATABASE_URL=... / export GIN_AMQP_URL=...
    python scripts/servers.py stop --state-dir .run/servers [--purge]

For each server, ``ensure`` picks the first of:

1. the setting from the environment (``GIN_DATABASE_URL``, ``GIN_AMQP_URL``), used as is when
   it answers, else a clear error and a non-zero exit;
2. a throwaway server this script already runs from the same state dir;
3. the standard port on 127.0.0.1 (5432 with user ``postgres`` or ``root``; 5672 with
   guest/guest);
4. a new throwaway server on free ports, its data under the state dir, after installing the
   Debian packages (``postgresql``, ``rabbitmq-server``) when the binaries are missing.

``--throwaway`` skips 1 and 3. The throwaway servers outlive this process; ``stop`` ends them
and never touches a process it did not start (every process it starts carries
``GIN_SERVERS_OWNER=<state dir>`` in its environment, and ``stop`` checks for it).

``create_database`` and ``drop_database`` give each test run its own database (via ``psql``).
See /work/shared/INFRA.md for the facts this follows.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit, urlunsplit

DATABASE_ENV = "GIN_DATABASE_URL"
AMQP_ENV = "GIN_AMQP_URL"
OWNER_ENV = "GIN_SERVERS_OWNER"
PG_OS_USER = "gin-pg"
PG_STANDARD_PORT = 5432
AMQP_STANDARD_PORT = 5672
LOCALHOST = "127.0.0.1"
STATE_FILE = "state.json"
RABBIT_BIN_DIR = Path("/usr/lib/rabbitmq/bin")
DEFAULT_TIMEOUT_S = 120.0
# A unix socket path (…/.s.PGSQL.NNNNN) must fit in sun_path (108 bytes with the NUL).
MAX_SOCKET_DIR_LEN = 90


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


# --------------------------------------------------------------------------------------------
# Processes and ports


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_ports(count: int, preferred: Sequence[int | None] = ()) -> list[int]:
    """Distinct ports on 127.0.0.1 that nothing listens on; a preferred one when still free."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        for index in range(count):
            wanted = preferred[index] if index < len(preferred) else None
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            if wanted:
                try:
                    sock.bind((LOCALHOST, wanted))
                except OSError:
                    sock.close()
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sockets.append(sock)
                    sock.bind((LOCALHOST, 0))
            else:
                sock.bind((LOCALHOST, 0))
            ports.append(int(sock.getsockname()[1]))
    finally:
        for sock in sockets:
            sock.close()
    return ports


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


# --------------------------------------------------------------------------------------------
# Packages and binaries


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


def _version_key(path: str) -> tuple[int, ...]:
    name = Path(path).parent.name
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def find_pg_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin holding initdb, pg_ctl and postgres."""
    candidates = [
        path
        for path in glob.glob("/usr/lib/postgresql/*/bin")
        if all(os.access(Path(path, exe), os.X_OK) for exe in ("initdb", "pg_ctl", "postgres"))
    ]
    if not candidates:
        return None
    return Path(max(candidates, key=_version_key))


def find_client(name: str) -> str | None:
    """psql / pg_isready: on PATH, else in a /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    bindirs = [
        d for d in glob.glob("/usr/lib/postgresql/*/bin") if os.access(Path(d, name), os.X_OK)
    ]
    return str(Path(max(bindirs, key=_version_key), name)) if bindirs else None


def find_psql(installer: Installer | None) -> str:
    psql = find_client("psql")
    if psql is None and installer is not None:
        installer.install(["postgresql"], "psql is missing")
        psql = find_client("psql")
    if psql is None:
        raise ServerError("psql is not installed (Debian package postgresql-client)")
    return psql


def pg_bindir(installer: Installer) -> Path:
    bindir = find_pg_bindir()
    if bindir is None:
        installer.install(["postgresql"], "PostgreSQL binaries are missing")
        bindir = find_pg_bindir()
    if bindir is None:
        raise ServerError("no PostgreSQL under /usr/lib/postgresql/*/bin even after apt-get")
    return bindir


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


# --------------------------------------------------------------------------------------------
# PostgreSQL clients


def pg_env() -> dict[str, str]:
    """The environment for psql / pg_isready: no stray PG* settings, a connect timeout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "5"
    return env


def pg_hosts(url: str) -> list[tuple[str, int]]:
    """The (host, port) of each server a URL names: one, or several (``h1:p1,h2:p2``, as
    libpq and asyncpg read it: the first that suits ``target_session_attrs``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ServerError(f"{redact(url)} is not a postgresql:// URL")
    hosts = parts.netloc.rpartition("@")[2]
    found = []
    for spec in hosts.split(","):
        host, port = spec, ""
        if ":" in spec and not spec.endswith("]"):  # [::1] alone is a host without a port
            host, _, port = spec.rpartition(":")
        try:
            number = int(port) if port else PG_STANDARD_PORT
        except ValueError as exc:
            raise ServerError(f"{redact(url)} has an invalid port") from exc
        if not 0 < number < 65536:
            raise ServerError(f"{redact(url)} has an invalid port")
        found.append((unquote(host.strip("[]")) or LOCALHOST, number))
    return found


def pg_host_port(url: str) -> tuple[str, int]:
    """The first server a URL names."""
    return pg_hosts(url)[0]


def pg_ready(url: str) -> tuple[bool, str]:
    """TCP connect (to any of the URL's servers), then pg_isready when it is installed."""
    hosts = pg_hosts(url)
    if not any(tcp_open(host, port, timeout=3.0) for host, port in hosts):
        named = ", ".join(f"{host}:{port}" for host, port in hosts)
        return False, f"nothing accepts TCP connections on {named}"
    pg_isready = find_client("pg_isready")
    if pg_isready is None:
        return True, "TCP connect ok (pg_isready not installed)"
    result = run([pg_isready, "-d", url, "-t", "5"], env=pg_env(), timeout=15)
    if result.returncode == 0:
        return True, "accepting connections"
    return False, f"pg_isready says: {output_of(result)}"


def psql_query(url: str, sql: str, psql: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [psql or find_psql(None), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
    return run([*command, "-d", url, "-c", sql], env=pg_env(), timeout=60)


DB_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def database_url(admin_url: str, name: str) -> str:
    """admin_url pointing at database ``name`` instead."""
    return urlunsplit(urlsplit(admin_url)._replace(path="/" + quote(name)))


def _check_db_name(name: str) -> None:
    if not DB_NAME_RE.fullmatch(name):
        raise ServerError(
            f"database name {name!r}: use 1 to 63 letters, digits or _, not a digit first"
        )


def create_database(admin_url: str, name: str) -> str:
    """Create database ``name`` through admin_url (a role allowed CREATE DATABASE); its URL."""
    _check_db_name(name)
    pg_host_port(admin_url)
    result = psql_query(admin_url, f'CREATE DATABASE "{name}"')
    if result.returncode != 0:
        raise ServerError(
            f"cannot create database {name} on {redact(admin_url)}: {output_of(result)}"
        )
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` (if it exists), disconnecting its sessions."""
    _check_db_name(name)
    pg_host_port(admin_url)
    result = psql_query(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if result.returncode != 0:
        raise ServerError(
            f"cannot drop database {name} on {redact(admin_url)}: {output_of(result)}"
        )


# --------------------------------------------------------------------------------------------
# AMQP 0-9-1, just enough to log in and out


AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE


def _shortstr(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ServerError(f"AMQP short string too long: {value[:20]}...")
    return bytes([len(raw)]) + raw


def _longstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def _method_frame(class_id: int, method_id: int, args: bytes) -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + args
    return struct.pack(">BHI", FRAME_METHOD, 0, len(payload)) + payload + bytes([FRAME_END])


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        chunks += chunk
    return bytes(chunks)


def _read_method(sock: socket.socket) -> tuple[int, int, bytes]:
    while True:
        frame_type, _channel, size = struct.unpack(">BHI", _recv_exactly(sock, 7))
        payload = _recv_exactly(sock, size)
        if _recv_exactly(sock, 1)[0] != FRAME_END:
            raise ConnectionError("malformed AMQP frame")
        if frame_type == FRAME_HEARTBEAT:
            continue
        if frame_type != FRAME_METHOD or len(payload) < 4:
            raise ConnectionError(f"unexpected AMQP frame type {frame_type}")
        class_id, method_id = struct.unpack(">HH", payload[:4])
        return class_id, method_id, payload[4:]


def _close_reason(args: bytes) -> str:
    code = struct.unpack(">H", args[:2])[0]
    text = args[3 : 3 + args[2]].decode(errors="replace")
    return f"{code} {text}"


def amqp_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when host:port answers the AMQP 0-9-1 header with a Connection.Start frame."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(AMQP_HEADER)
            head = _recv_exactly(sock, 11)
    except OSError:
        return False
    return head[0] == FRAME_METHOD and head[7:11] == struct.pack(">HH", 10, 10)


def amqp_login(url: str, timeout: float = 10.0) -> None:
    """Open and close an AMQP connection with the URL's credentials and vhost, or raise."""
    parts = urlsplit(url)
    host = parts.hostname or LOCALHOST
    port = parts.port or AMQP_STANDARD_PORT
    user = unquote(parts.username or "guest")
    password = unquote(parts.password or "guest")
    vhost = unquote(parts.path[1:]) if parts.path not in ("", "/") else "/"
    capabilities = _shortstr("authentication_failure_close") + b"t\x01"
    client_properties = _shortstr("capabilities") + b"F" + _longstr(capabilities)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(AMQP_HEADER)
            class_id, method_id, _args = _read_method(sock)
            if (class_id, method_id) != (10, 10):
                raise ServerError(f"{host}:{port} does not speak AMQP 0-9-1")
            response = b"\0" + user.encode() + b"\0" + password.encode()
            sock.sendall(
                _method_frame(
                    10,
                    11,
                    _longstr(client_properties)
                    + _shortstr("PLAIN")
                    + _longstr(response)
                    + _shortstr("en_US"),
                )
            )
            class_id, method_id, args = _read_method(sock)
            if (class_id, method_id) == (10, 50):
                raise ServerError(f"login as {user} refused: {_close_reason(args)}")
            if (class_id, method_id) != (10, 30):
                raise ServerError(f"unexpected AMQP method {class_id}.{method_id} after login")
            channel_max, frame_max, _heartbeat = struct.unpack(">HIH", args[:8])
            sock.sendall(_method_frame(10, 31, struct.pack(">HIH", channel_max, frame_max, 0)))
            sock.sendall(_method_frame(10, 40, _shortstr(vhost) + _shortstr("") + b"\0"))
            class_id, method_id, args = _read_method(sock)
            if (class_id, method_id) == (10, 50):
                raise ServerError(f"vhost {vhost!r} refused: {_close_reason(args)}")
            sock.sendall(_method_frame(10, 50, struct.pack(">H", 200) + _shortstr("") + bytes(4)))
            with contextlib.suppress(OSError):
                _read_method(sock)  # Connection.Close-Ok
    except ServerError:
        raise
    except ConnectionError as exc:
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
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ServerError(f"{redact(url)} is not an amqp:// URL")
    try:
        host = parts.hostname or LOCALHOST
        port = parts.port or (5671 if parts.scheme == "amqps" else AMQP_STANDARD_PORT)
    except ValueError as exc:
        raise ServerError(f"{redact(url)} has an invalid port") from exc
    if not tcp_open(host, port, timeout=3.0):
        return False, f"nothing accepts TCP connections on {host}:{port}"
    if parts.scheme == "amqps":
        return True, "TCP connect ok (TLS not checked further)"
    try:
        amqp_login(url)
    except ServerError as exc:
        return False, str(exc)
    return True, "AMQP login ok"


# --------------------------------------------------------------------------------------------
# State


@dataclass
class PgState:
    """A throwaway PostgreSQL this script started."""

    root: str  # holds data/, sock/, log/
    data_dir: str
    port: int
    url: str
    os_user: str | None  # None: runs as the invoking user
    pid: int | None = None
    initdb_s: float | None = None
    start_s: float | None = None


@dataclass
class RabbitState:
    """A throwaway RabbitMQ this script started."""

    root: str
    nodename: str
    port: int
    dist_port: int
    epmd_port: int
    url: str
    script_pid: int | None = None
    beam_pid: int | None = None
    epmd_pid: int | None = None
    start_s: float | None = None


@dataclass
class State:
    postgres: PgState | None = None
    rabbitmq: RabbitState | None = None


def load_state(state_dir: Path) -> State:
    path = state_dir / STATE_FILE
    if not path.exists():
        return State()
    try:
        raw: Any = json.loads(path.read_text())
        pg = raw.get("postgres")
        rabbit = raw.get("rabbitmq")
        return State(
            postgres=PgState(**pg) if pg else None,
            rabbitmq=RabbitState(**rabbit) if rabbit else None,
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise ServerError(
            f"{path} is not a state file this script wrote ({exc}); stop its servers by hand "
            "and remove it"
        ) from exc


def save_state(state_dir: Path, state: State) -> None:
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(state), indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """One ensure/stop at a time per state dir."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def owner_of(state_dir: Path) -> str:
    return str(state_dir.resolve())


# --------------------------------------------------------------------------------------------
# Throwaway PostgreSQL


def ensure_os_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise ServerError(f"useradd is missing: cannot create system user {name} for initdb")
    log(f"creating system user {name} (initdb and postgres refuse to run as root)")
    result = run(
        [
            useradd,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        timeout=30,
    )
    if result.returncode != 0:
        raise ServerError(f"useradd {name} failed: {output_of(result)}")
    return pwd.getpwnam(name)


def as_user(os_user: str | None, argv: Sequence[str]) -> list[str]:
    if os_user is None:
        return list(argv)
    runuser = shutil.which("runuser")
    if runuser is None:
        raise ServerError("runuser (util-linux) is missing: cannot run initdb as " + os_user)
    return [runuser, "-u", os_user, "--", *argv]


def user_can_write(os_user: str | None, directory: Path) -> bool:
    if os_user is None:
        return os.access(directory, os.W_OK | os.X_OK)
    test = shutil.which("test") or "/usr/bin/test"
    probe = [test, "-w", str(directory), "-a", "-x", str(directory)]
    return run(as_user(os_user, probe), timeout=10).returncode == 0


def prepare_dir(path: Path, owner: pwd.struct_passwd | None) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def fallback_pg_root(state_dir: Path) -> Path:
    digest = hashlib.sha256(owner_of(state_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"gin-pg-{digest}"


def pg_root_for(state_dir: Path, os_user: str | None) -> Path:
    """state_dir/pg when the postgres user can reach it, else a folder of its own in /tmp."""
    owner = pwd.getpwnam(os_user) if os_user else None
    root = state_dir / "pg"
    prepare_dir(root, owner)
    if user_can_write(os_user, root):
        return root
    fallback = fallback_pg_root(state_dir)
    log(
        f"{os_user} cannot reach {root} (a parent folder is not searchable); "
        f"keeping the PostgreSQL data in {fallback} instead"
    )
    prepare_dir(fallback, owner)
    if owner is not None and fallback.stat().st_uid != owner.pw_uid:
        raise ServerError(f"{fallback} exists and is not owned by {os_user}; remove it")
    return fallback


def read_postmaster_pid(data_dir: Path) -> int | None:
    try:
        first = (data_dir / "postmaster.pid").read_text().splitlines()[0]
        return int(first.strip())
    except (OSError, IndexError, ValueError):
        return None


def pg_owned_pid(entry: PgState, owner: str) -> int | None:
    """The running postmaster of this entry, if it is one this script started."""
    for pid in (read_postmaster_pid(Path(entry.data_dir)), entry.pid):
        if owned_by(pid, owner, "postgres", entry.data_dir):
            return pid
    return None


# A throwaway server is for tests: nothing it holds must survive a crash, so it skips the
# flushes. PRODUCTION's durability and housekeeping, for what measures or crashes it as
# production runs (make bench, make chaos): ``start_postgres(..., conf=PRODUCTION)``.
THROWAWAY = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
PRODUCTION = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "autovacuum": "on",
}


def write_pg_conf(
    data_dir: Path, root: Path, port: int, conf: Mapping[str, str] | None = None
) -> None:
    """gin.conf, included by postgresql.conf: where it listens, and THROWAWAY's settings
    unless ``conf`` says otherwise (``conf`` may set any other parameter too)."""
    socket_dir = root / "sock"
    sockets = str(socket_dir) if len(str(socket_dir)) <= MAX_SOCKET_DIR_LEN else ""
    if not sockets:
        log(f"{socket_dir} is too long for a unix socket path; PostgreSQL will listen on TCP only")

    def quoted(value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    (data_dir / "gin.conf").write_text(
        "# Written by scripts/servers.py on every start.\n"
        f"listen_addresses = {quoted(LOCALHOST)}\n"
        f"port = {port}\n"
        f"unix_socket_directories = {quoted(sockets)}\n"
        "max_connections = 200\n"
        + "".join(
            f"{name} = {quoted(value)}\n" for name, value in {**THROWAWAY, **(conf or {})}.items()
        )
    )
    main_conf = data_dir / "postgresql.conf"
    include = "include_if_exists = 'gin.conf'"
    if include not in main_conf.read_text():
        with main_conf.open("a") as handle:
            handle.write(f"\n{include}\n")


def start_postgres(
    state_dir: Path,
    state: State,
    installer: Installer,
    timeout: float,
    conf: Mapping[str, str] | None = None,
) -> PgState:
    """A throwaway server under ``state_dir`` (its data kept for the next start), with
    ``conf``'s parameters over THROWAWAY's (``write_pg_conf``)."""
    bindir = pg_bindir(installer)
    owner_tag = owner_of(state_dir)
    os_user: str | None = None
    passwd: pwd.struct_passwd | None = None
    if os.geteuid() == 0:
        passwd = ensure_os_user(PG_OS_USER)
        os_user = PG_OS_USER
    previous = state.postgres
    root = Path(previous.root) if previous else pg_root_for(state_dir, os_user)
    if previous and not root.is_dir():
        root = pg_root_for(state_dir, os_user)
    data_dir = root / "data"
    for sub in ("sock", "log"):
        prepare_dir(root / sub, passwd)
    env = pg_env()
    env.pop("PGCONNECT_TIMEOUT")
    env[OWNER_ENV] = owner_tag

    initdb_s: float | None = None
    version_file = data_dir / "PG_VERSION"
    if version_file.exists():
        data_version = version_file.read_text().strip()
        if data_version != bindir.parent.name:
            raise ServerError(
                f"{data_dir} holds PostgreSQL {data_version} data but {bindir} is "
                f"{bindir.parent.name}; run `stop --purge` on this state dir to start afresh"
            )
    else:
        if data_dir.exists():
            shutil.rmtree(data_dir)  # a half-made cluster from an interrupted initdb
        began = time.monotonic()
        result = run(
            as_user(
                os_user,
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data_dir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ],
            ),
            env=env,
            cwd=root,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise ServerError(f"initdb failed: {output_of(result)}")
        initdb_s = time.monotonic() - began

    preferred = previous.port if previous else None
    (port,) = free_ports(1, [preferred])
    write_pg_conf(data_dir, root, port, conf)
    entry = PgState(
        root=str(root),
        data_dir=str(data_dir),
        port=port,
        url=f"postgresql://postgres@{LOCALHOST}:{port}/postgres",
        os_user=os_user,
        initdb_s=initdb_s,
    )
    state.postgres = entry
    save_state(state_dir, state)  # recorded before it runs, so `stop` finds it after a crash

    log_file = root / "log" / "postgres.log"
    began = time.monotonic()
    result = run(
        as_user(
            os_user,
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data_dir),
                "-l",
                str(log_file),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
        ),
        env=env,
        cwd=root,
        timeout=timeout + 10,
    )
    if result.returncode != 0:
        raise ServerError(
            f"pg_ctl start failed: {output_of(result)}\n--- {log_file} ---\n{tail(log_file)}"
        )
    entry.pid = read_postmaster_pid(data_dir)
    ready, why = pg_ready(entry.url)
    if not ready:
        raise ServerError(f"PostgreSQL started but does not answer: {why}\n{tail(log_file)}")
    entry.start_s = time.monotonic() - began
    save_state(state_dir, state)
    return entry


def stop_postgres(entry: PgState, owner: str) -> None:
    pid = pg_owned_pid(entry, owner)
    if pid is None:
        log(f"postgres: no server of ours is running on port {entry.port}")
        return
    send_signal(pid, signal.SIGINT)  # fast shutdown
    if not wait_gone([pid], 60):
        log(f"postgres: pid {pid} ignored SIGINT for 60 s; sending SIGQUIT")
        send_signal(pid, signal.SIGQUIT)
        if not wait_gone([pid], 10):
            send_signal(pid, signal.SIGKILL)
            wait_gone([pid], 10)
    log(f"postgres: stopped pid {pid} (port {entry.port})")


# --------------------------------------------------------------------------------------------
# Throwaway RabbitMQ


def rabbit_env(entry: RabbitState, owner: str) -> dict[str, str]:
    """The environment for rabbitmq-server and rabbitmqctl (INFRA.md's list, and isolation)."""
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


def read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


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


def start_rabbitmq(
    state_dir: Path, state: State, installer: Installer, timeout: float
) -> RabbitState:
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
    deadline = time.monotonic() + 10
    while not tcp_open(LOCALHOST, epmd_port, 0.5):
        if not pid_alive(entry.epmd_pid) or time.monotonic() > deadline:
            raise ServerError(
                f"epmd did not start on port {epmd_port}: {tail(root / 'log' / 'epmd.log')}"
            )
        time.sleep(0.05)

    entry.script_pid = spawn_detached([str(bindir / "rabbitmq-server")], env, root, log_file)
    save_state(state_dir, state)
    deadline = began + timeout
    while not amqp_answers(LOCALHOST, port):
        if not pid_alive(entry.script_pid):
            raise ServerError(f"rabbitmq-server exited while starting:\n{tail(log_file)}")
        if time.monotonic() > deadline:
            raise ServerError(
                f"RabbitMQ did not answer on port {port} within {timeout:.0f} s:\n{tail(log_file)}"
            )
        time.sleep(0.2)
    remaining = max(10.0, deadline - time.monotonic())
    result = run(
        [
            str(bindir / "rabbitmqctl"),
            "-n",
            entry.nodename,
            "await_startup",
            "--timeout",
            str(int(remaining)),
        ],
        env=env,
        cwd=root,
        timeout=remaining + 30,
    )
    if result.returncode != 0:
        raise ServerError(f"rabbitmqctl await_startup failed: {output_of(result)}")
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


# --------------------------------------------------------------------------------------------
# ensure / stop


def standard_postgres_url(installer: Installer) -> str | None:
    """A URL for the server on 127.0.0.1:5432 that psql can log in to, if any."""
    if not tcp_open(LOCALHOST, PG_STANDARD_PORT):
        return None
    psql = find_psql(installer)
    failures: list[str] = []
    for user in ("postgres", "root"):
        url = f"postgresql://{user}@{LOCALHOST}:{PG_STANDARD_PORT}/postgres"
        result = psql_query(url, "select 1", psql)
        if result.returncode == 0 and result.stdout.strip() == "1":
            return url
        failures.append(f"{user}: {output_of(result)}")
    log(f"postgres: port {PG_STANDARD_PORT} answers but psql cannot log in ({'; '.join(failures)})")
    return None


def standard_amqp_url() -> str | None:
    url = f"amqp://guest:guest@{LOCALHOST}:{AMQP_STANDARD_PORT}/"
    if not tcp_open(LOCALHOST, AMQP_STANDARD_PORT):
        return None
    ok, why = amqp_ready(url)
    if not ok:
        log(f"rabbitmq: port {AMQP_STANDARD_PORT} answers but {why}")
        return None
    return url


def reuse_postgres(entry: PgState, owner: str) -> bool:
    if pg_owned_pid(entry, owner) is None:
        return False
    deadline = time.monotonic() + 30
    while True:
        ready, _why = pg_ready(entry.url)
        if ready:
            return True
        if time.monotonic() > deadline:
            log("postgres: our previous server runs but does not answer; restarting it")
            stop_postgres(entry, owner)
            return False
        time.sleep(0.5)


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


def check_given(name: str, url: str) -> str:
    check = pg_ready if name == DATABASE_ENV else amqp_ready
    try:
        ok, why = check(url)
    except ServerError as exc:
        raise ServerError(f"{name}: {exc}") from exc
    if not ok:
        raise ServerError(
            f"{name}={redact(url)} is set but not usable: {why}. Start that server, fix the "
            f"setting, or unset {name} to let this script find or start one."
        )
    log(f"{'postgres' if name == DATABASE_ENV else 'rabbitmq'}: using {name} ({redact(url)})")
    return url


def ensure(
    state_dir: Path,
    *,
    throwaway: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Make both servers available; return {GIN_DATABASE_URL: ..., GIN_AMQP_URL: ...}."""
    environ = os.environ if environ is None else environ
    state_dir = state_dir.absolute()
    settings: dict[str, str] = {}
    if not throwaway:
        # Settings from the environment first, so a bad one fails before anything starts.
        for name in (DATABASE_ENV, AMQP_ENV):
            given = environ.get(name, "").strip()
            if given:
                settings[name] = check_given(name, given)
    installer = Installer()
    owner = owner_of(state_dir)
    with locked(state_dir):
        state = load_state(state_dir)

        if DATABASE_ENV not in settings:
            pg = state.postgres
            if pg and reuse_postgres(pg, owner):
                log(f"postgres: reusing our throwaway server on port {pg.port} (pid {pg.pid})")
                settings[DATABASE_ENV] = pg.url
            elif not throwaway and (url := standard_postgres_url(installer)):
                log(f"postgres: using the server on the standard port ({url})")
                settings[DATABASE_ENV] = url
            else:
                pg = start_postgres(state_dir, state, installer, timeout)
                initdb = f", after initdb {pg.initdb_s:.2f} s" if pg.initdb_s is not None else ""
                log(
                    f"postgres: throwaway server started on port {pg.port} (pid {pg.pid}) "
                    f"in {pg.start_s or 0:.2f} s{initdb}; data in {pg.data_dir}"
                )
                settings[DATABASE_ENV] = pg.url

        if AMQP_ENV not in settings:
            rabbit = state.rabbitmq
            if rabbit and reuse_rabbitmq(rabbit, owner, timeout):
                log(f"rabbitmq: reusing our throwaway node on port {rabbit.port}")
                settings[AMQP_ENV] = rabbit.url
            elif not throwaway and (url := standard_amqp_url()):
                log(f"rabbitmq: using the server on the standard port ({redact(url)})")
                settings[AMQP_ENV] = url
            else:
                rabbit = start_rabbitmq(state_dir, state, installer, timeout)
                log(
                    f"rabbitmq: throwaway node started on port {rabbit.port} "
                    f"(beam pid {rabbit.beam_pid}) in {rabbit.start_s or 0:.2f} s; "
                    f"data in {rabbit.root}"
                )
                settings[AMQP_ENV] = rabbit.url
    return settings


def stop(state_dir: Path, *, purge: bool = False) -> None:
    """Stop the throwaway servers ensure started in state_dir (and only those)."""
    state_dir = state_dir.absolute()
    if not state_dir.is_dir():
        log(f"{state_dir} does not exist: nothing to stop")
        return
    owner = owner_of(state_dir)
    with locked(state_dir):
        state = load_state(state_dir)
        if state.postgres is None and state.rabbitmq is None:
            log(f"no throwaway servers recorded in {state_dir}")
        if state.postgres is not None:
            stop_postgres(state.postgres, owner)
        if state.rabbitmq is not None:
            stop_rabbitmq(state.rabbitmq, owner)
        if purge:
            for path in (state_dir / "pg", fallback_pg_root(state_dir), state_dir / "rabbitmq"):
                if path.is_dir():
                    shutil.rmtree(path)
            with contextlib.suppress(FileNotFoundError):
                (state_dir / STATE_FILE).unlink()
            log(f"purged the throwaway servers' data in {state_dir}")
    if purge:
        with contextlib.suppress(OSError):
            (state_dir / ".lock").unlink()
            state_dir.rmdir()


def export_lines(settings: Mapping[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in settings.items())


def write_env_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# --------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="servers.py", description="Make sure PostgreSQL and RabbitMQ servers are available."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    ensure_cmd = commands.add_parser("ensure", help="find or start both servers")
    ensure_cmd.add_argument("--state-dir", type=Path, required=True)
    ensure_cmd.add_argument("--env-file", type=Path, help="also write the export lines here")
    ensure_cmd.add_argument(
        "--throwaway",
        action="store_true",
        help="ignore GIN_* settings and standard ports; use throwaway servers",
    )
    ensure_cmd.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds each start may take"
    )

    stop_cmd = commands.add_parser("stop", help="stop the throwaway servers of a state dir")
    stop_cmd.add_argument("--state-dir", type=Path, required=True)
    stop_cmd.add_argument("--purge", action="store_true", help="also delete their data")

    create_cmd = commands.add_parser("create-db", help="create a database, print its URL")
    create_cmd.add_argument("--admin-url", required=True)
    create_cmd.add_argument("name")

    drop_cmd = commands.add_parser("drop-db", help="drop a database if it exists")
    drop_cmd.add_argument("--admin-url", required=True)
    drop_cmd.add_argument("name")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = parse_args(argv)
    out = out or sys.stdout
    try:
        if args.command == "ensure":
            settings = ensure(args.state_dir, throwaway=args.throwaway, timeout=args.timeout)
            text = export_lines(settings)
            if args.env_file is not None:
                write_env_file(args.env_file, text)
            out.write(text)
        elif args.command == "stop":
            stop(args.state_dir, purge=args.purge)
        elif args.command == "create-db":
            out.write(create_database(args.admin_url, args.name) + "\n")
        elif args.command == "drop-db":
            drop_database(args.admin_url, args.name)
    except ServerError as exc:
        print(f"servers.py {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"servers.py {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"servers.py {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
