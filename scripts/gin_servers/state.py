"""What throwaway servers a state dir holds: its ``state.json``, written before a server runs
so that ``stop`` finds it after a crash, and its lock (one ensure or stop at a time)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gin_servers.common import ServerError

STATE_FILE = "state.json"


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
