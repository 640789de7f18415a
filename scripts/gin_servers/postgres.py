"""A throwaway PostgreSQL server under a state dir: made with initdb, started with pg_ctl,
reused while it answers, stopped by a signal to its postmaster.

initdb and postgres refuse to run as root: as root, both run as the system user ``gin-pg``
(created with useradd when missing, through runuser), whose data folder must be reachable by
that user (else it goes to a folder of its own under /tmp).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gin_servers.common import (
    LOCALHOST,
    OWNER_ENV,
    Installer,
    ServerError,
    free_ports,
    log,
    output_of,
    owned_by,
    prepare_dir,
    run,
    send_signal,
    tail,
    wait_gone,
)
from gin_servers.pg_client import pg_bindir, pg_env, pg_ready, standard_postgres_url
from gin_servers.state import PgState, State, owner_of, save_state

PG_OS_USER = "gin-pg"
# A unix socket path (…/.s.PGSQL.NNNNN) must fit in sun_path (108 bytes with the NUL).
MAX_SOCKET_DIR_LEN = 90


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


def _initdb_unless_made(
    bindir: Path, data_dir: Path, os_user: str | None, env: Mapping[str, str], timeout: float
) -> float | None:
    """initdb into data_dir unless it holds a cluster of bindir's version already; the
    seconds initdb took (None when it did not run)."""
    version_file = data_dir / "PG_VERSION"
    if version_file.exists():
        data_version = version_file.read_text().strip()
        if data_version != bindir.parent.name:
            raise ServerError(
                f"{data_dir} holds PostgreSQL {data_version} data but {bindir} is "
                f"{bindir.parent.name}; run `stop --purge` on this state dir to start afresh"
            )
        return None
    if data_dir.exists():
        shutil.rmtree(data_dir)  # a half-made cluster from an interrupted initdb
    began = time.monotonic()
    initdb = [
        str(bindir / "initdb"),
        *("-D", str(data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8"),
        *("--locale=C.UTF-8", "--no-sync"),
    ]
    result = run(as_user(os_user, initdb), env=env, cwd=data_dir.parent, timeout=timeout)
    if result.returncode != 0:
        raise ServerError(f"initdb failed: {output_of(result)}")
    return time.monotonic() - began


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

    initdb_s = _initdb_unless_made(bindir, data_dir, os_user, env, timeout)

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


def ensure_postgres(
    state_dir: Path, state: State, installer: Installer, *, throwaway: bool, timeout: float
) -> str:
    """A server's URL: our running throwaway server, else (unless ``throwaway``) the standard
    port's server, else a new throwaway server."""
    pg = state.postgres
    if pg and reuse_postgres(pg, owner_of(state_dir)):
        log(f"postgres: reusing our throwaway server on port {pg.port} (pid {pg.pid})")
        return pg.url
    if not throwaway and (url := standard_postgres_url(installer)):
        log(f"postgres: using the server on the standard port ({url})")
        return url
    pg = start_postgres(state_dir, state, installer, timeout)
    initdb = f", after initdb {pg.initdb_s:.2f} s" if pg.initdb_s is not None else ""
    log(
        f"postgres: throwaway server started on port {pg.port} (pid {pg.pid}) "
        f"in {pg.start_s or 0:.2f} s{initdb}; data in {pg.data_dir}"
    )
    return pg.url
