"""The real table and chat services as processes, a few real tables, and a count of the cases.

Both services start once per run (``services``) with this run's settings; each fuzz module
makes its own tables (``world``), so one module's accepted moves never surprise another's.
Each service writes its output to a file: a 5xx in a test quotes the traceback it logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.e2e.processes import Service

# How many requests and frames each part of the suite sent (printed at the end of the run).
CASES: Counter[str] = Counter()
# Statuses answered, by operation (``GIN_FUZZ_VERBOSE=1`` prints them).
ANSWERS: defaultdict[str, Counter[int]] = defaultdict(Counter)
STARTED = time.monotonic()


@dataclass
class Running:
    """One service process and the file its output goes to."""

    service: Service
    log: Path
    read_upto: int = 0

    @property
    def base(self) -> str:
        return self.service.base

    def alive(self) -> bool:
        return self.service.proc.poll() is None

    def new_output(self) -> str:
        """What the service wrote since the last call (tracebacks of a 5xx, say)."""
        with self.log.open("rb") as f:
            f.seek(self.read_upto)
            data = f.read()
        self.read_upto += len(data)
        return data.decode(errors="replace")


@dataclass
class Services:
    """The table service and the chat service of this run."""

    table: Running
    chat: Running
    settings: Settings


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """A child started inside writes its stdout and stderr to ``path`` (it inherits fds)."""
    with path.open("ab") as log:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _start(module: str, settings: Settings, log: Path) -> Running:
    with _output_to(log):
        service = Service(module, settings)
    return Running(service, log)


@pytest.fixture(scope="session")
def services(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """``python -m services.table`` and ``python -m services.chat``, ready."""
    logs = tmp_path_factory.mktemp("fuzz-services")
    table = _start("services.table", settings, logs / "table.log")
    chat = _start("services.chat", settings, logs / "chat.log")
    try:

        async def ready() -> None:
            await asyncio.gather(table.service.ready(), chat.service.ready())

        asyncio.run(ready())
        yield Services(table=table, chat=chat, settings=settings)
    finally:
        table.service.stop()
        chat.service.stop()


@dataclass
class World:
    """Real tables and identities, so the fuzz reaches past ``no_such_table``."""

    tokens: dict[str, str]  # ana and bia seated at ``seated``, cid a spectator
    seated: str  # a table with both seats taken: a hand is on
    waiting: str  # a table waiting for its second player
    invite: str  # the waiting table's invitation code
    seated_invite: str
    http: requests.Session = field(default_factory=requests.Session)

    def header(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def table_state(self, base: str, table_id: str) -> tuple[int, int]:
        """The table's version and how many events it has (its public log)."""
        view = self.http.get(f"{base}/v1/tables/{table_id}", timeout=10)
        assert view.status_code == 200, view.text
        events = self.http.get(f"{base}/v1/tables/{table_id}/events", timeout=10)
        assert events.status_code == 200, events.text
        return int(view.json()["version"]), len(events.json())


def make_world(services: Services, label: str) -> World:
    """Three identities (fresh per module), a seated table and a waiting one; the chat has
    heard of the seated table before this returns."""
    secret = services.settings.auth_secret
    tokens = {
        who: mint(secret, f"fuzz-{label}-{who}", who.capitalize()) for who in ("ana", "bia", "cid")
    }
    http = requests.Session()
    base = services.table.base

    def post(path: str, who: str, body: Any) -> Any:
        r = http.post(
            f"{base}{path}", json=body, headers={"Authorization": f"Bearer {tokens[who]}"}
        )
        assert r.status_code < 300, r.text
        return r.json()

    seated = post("/v1/tables", "ana", {})
    post(f"/v1/tables/{seated['table_id']}/join", "bia", {"invite_code": seated["invite_code"]})
    waiting = post("/v1/tables", "ana", {})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the chat learns tables from the table's events
        r = http.get(f"{services.chat.base}/v1/tables/{seated['table_id']}/messages")
        if r.status_code == 200:
            break
        time.sleep(0.1)
    else:
        raise TimeoutError("the chat service never heard of the seated table")
    return World(
        tokens=tokens,
        seated=seated["table_id"],
        waiting=waiting["table_id"],
        invite=waiting["invite_code"],
        seated_invite=seated["invite_code"],
        http=http,
    )


def assert_error_shape(status: int, body: bytes) -> None:
    """The one refusal shape, exactly."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise AssertionError(f"{status}: the body is not JSON: {body[:200]!r}") from None
    assert isinstance(doc, dict), f"{status}: {doc!r}"
    assert set(doc) == {"error"}, f"{status}: {doc!r}"
    error = doc["error"]
    assert isinstance(error, dict), f"{status}: {doc!r}"
    assert set(error) == {"code", "message", "rule"}, f"{status}: {doc!r}"
    assert isinstance(error["code"], str), f"{status}: {doc!r}"
    assert error["code"], f"{status}: {doc!r}"
    assert isinstance(error["message"], str), f"{status}: {doc!r}"
    assert error["rule"] is None or isinstance(error["rule"], str), f"{status}: {doc!r}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line: how many fuzz cases ran, of which kind, in how long."""
    if not CASES:
        return
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(CASES.items()))
    total = sum(CASES.values())
    terminalreporter.write_line(
        f"fuzz: {total} cases ({parts}) in {time.monotonic() - STARTED:.0f} s of this run"
    )
    if os.environ.get("GIN_FUZZ_VERBOSE"):
        for operation, statuses in sorted(ANSWERS.items()):
            terminalreporter.write_line(f"  {operation}: {dict(sorted(statuses.items()))}")
