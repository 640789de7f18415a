#!/usr/bin/env python3
"""Make sure a PostgreSQL and a RabbitMQ server are available.

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

A machine may have both servers running on the standard ports, or neither (a fresh machine:
then 4, which needs root or password-less sudo for apt-get). ``--throwaway`` skips 1 and 3.
The throwaway servers outlive this process; ``stop`` ends them and never touches a process it
did not start (every process it starts carries ``GIN_SERVERS_OWNER=<state dir>`` in its
environment, and ``stop`` checks for it).

``create_database`` and ``drop_database`` give each test run its own database (via ``psql``).

The work is done by the modules of ``scripts/gin_servers/`` (one a server, and what both
share); this module keeps the command line and every name the benches, chaos runs and tests
import from it. A broker's liveness is learned through aio-pika, so ``ensure`` runs with the
project's venv; ``stop`` needs the standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

# The package beside this file, however this file was loaded (run as a script, imported as
# ``servers`` or ``scripts.servers``, or from its path).
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

from gin_servers.amqp import (  # noqa: E402
    AMQP_STANDARD_PORT,
    amqp_answers,
    amqp_login,
    amqp_node_urls,
    amqp_ready,
    standard_amqp_url,
)
from gin_servers.common import (  # noqa: E402
    AMQP_ENV,
    DATABASE_ENV,
    DEFAULT_TIMEOUT_S,
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
    proc_cmdline,
    read_pid_file,
    redact,
    run,
    send_signal,
    spawn_detached,
    tail,
    tcp_open,
    wait_gone,
)
from gin_servers.pg_client import (  # noqa: E402
    DB_NAME_RE,
    PG_STANDARD_PORT,
    create_database,
    database_url,
    drop_database,
    find_client,
    find_pg_bindir,
    find_psql,
    pg_bindir,
    pg_env,
    pg_host_port,
    pg_hosts,
    pg_ready,
    psql_query,
    standard_postgres_url,
)
from gin_servers.postgres import (  # noqa: E402
    MAX_SOCKET_DIR_LEN,
    PG_OS_USER,
    PRODUCTION,
    THROWAWAY,
    as_user,
    ensure_os_user,
    ensure_postgres,
    fallback_pg_root,
    pg_owned_pid,
    pg_root_for,
    read_postmaster_pid,
    reuse_postgres,
    start_postgres,
    stop_postgres,
    user_can_write,
    write_pg_conf,
)
from gin_servers.rabbitmq import (  # noqa: E402
    RABBIT_BIN_DIR,
    ensure_rabbitmq,
    epmd_owned,
    find_epmd,
    rabbit_bindir,
    rabbit_env,
    rabbit_owned_pids,
    reuse_rabbitmq,
    start_rabbitmq,
    stop_rabbitmq,
    write_rabbit_config,
)
from gin_servers.state import (  # noqa: E402
    STATE_FILE,
    PgState,
    RabbitState,
    State,
    load_state,
    locked,
    owner_of,
    save_state,
)

__all__ = [
    "AMQP_ENV",
    "AMQP_STANDARD_PORT",
    "DATABASE_ENV",
    "DB_NAME_RE",
    "DEFAULT_TIMEOUT_S",
    "LOCALHOST",
    "MAX_SOCKET_DIR_LEN",
    "OWNER_ENV",
    "PG_OS_USER",
    "PG_STANDARD_PORT",
    "PRODUCTION",
    "RABBIT_BIN_DIR",
    "STATE_FILE",
    "THROWAWAY",
    "Installer",
    "PgState",
    "RabbitState",
    "ServerError",
    "State",
    "amqp_answers",
    "amqp_login",
    "amqp_node_urls",
    "amqp_ready",
    "as_user",
    "check_given",
    "create_database",
    "database_url",
    "drop_database",
    "ensure",
    "ensure_os_user",
    "epmd_owned",
    "export_lines",
    "fallback_pg_root",
    "find_client",
    "find_epmd",
    "find_pg_bindir",
    "find_psql",
    "free_ports",
    "load_state",
    "locked",
    "log",
    "main",
    "output_of",
    "owned_by",
    "owner_of",
    "parse_args",
    "pg_bindir",
    "pg_env",
    "pg_host_port",
    "pg_hosts",
    "pg_owned_pid",
    "pg_ready",
    "pg_root_for",
    "pid_alive",
    "prepare_dir",
    "proc_cmdline",
    "psql_query",
    "rabbit_bindir",
    "rabbit_env",
    "rabbit_owned_pids",
    "read_pid_file",
    "read_postmaster_pid",
    "redact",
    "reuse_postgres",
    "reuse_rabbitmq",
    "run",
    "save_state",
    "send_signal",
    "spawn_detached",
    "standard_amqp_url",
    "standard_postgres_url",
    "start_postgres",
    "start_rabbitmq",
    "stop",
    "stop_postgres",
    "stop_rabbitmq",
    "tail",
    "tcp_open",
    "user_can_write",
    "wait_gone",
    "write_env_file",
    "write_pg_conf",
    "write_rabbit_config",
]


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
    with locked(state_dir):
        state = load_state(state_dir)
        if DATABASE_ENV not in settings:
            settings[DATABASE_ENV] = ensure_postgres(
                state_dir, state, installer, throwaway=throwaway, timeout=timeout
            )
        if AMQP_ENV not in settings:
            settings[AMQP_ENV] = ensure_rabbitmq(
                state_dir, state, installer, throwaway=throwaway, timeout=timeout
            )
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
    """Write the env file whole: through a temporary file of this call's own, since the test
    workers (pytest-xdist) each run ``ensure`` and write the same file at about the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as tmp:
            tmp.write(text)
        os.chmod(name, 0o644)
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


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
