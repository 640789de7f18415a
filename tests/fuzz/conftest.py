"""The real table and chat services as processes, a few real tables, and a count of the cases.

Both services start once per run (``services``) with this run's settings; each fuzz module
makes its own tables (``world``), so one module's accepted moves never surprise another's.
Each service writes its output to a file: a 5xx in a test quotes the traceback it logged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.conftest import settings_of_their_own
from tests.e2e.processes import Service, output_to


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


def _start(module: str, settings: Settings, log: Path) -> Running:
    with output_to(log):
        service = Service(module, settings)
    return Running(service, log)


@pytest.fixture(scope="session")
def fuzz_settings(settings: Settings) -> Iterator[Settings]:
    """The run's settings with a database and a broker prefix of the fuzz's own: its services
    outlive its tests, and a table service on the run's database would relay the other tests'
    outbox rows to its own exchanges, and consume their expire commands with its own clock."""
    with settings_of_their_own(settings, "fuzz") as own:
        yield own


@pytest.fixture(scope="session")
def services(
    fuzz_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Services]:
    """``python -m services.table`` and ``python -m services.chat``, ready."""
    logs = tmp_path_factory.mktemp("fuzz-services")
    table = _start("services.table", fuzz_settings, logs / "table.log")
    chat = _start("services.chat", fuzz_settings, logs / "chat.log")
    try:

        async def ready() -> None:
            await asyncio.gather(table.service.ready(), chat.service.ready())

        asyncio.run(ready())
        yield Services(table=table, chat=chat, settings=fuzz_settings)
    finally:
        table.service.stop()
        chat.service.stop()


class World:
    """Real tables and identities, so the fuzz reaches past ``no_such_table``: ana and bia
    seated at ``seated`` (a hand on), cid a spectator, ``waiting`` waiting for a player;
    ``finished`` is the last seated table whose match ended (None before the first)."""

    def __init__(self, services: Services, label: str) -> None:
        self.table = services.table.base
        self.chat = services.chat.base
        secret = services.settings.auth_secret
        self.tokens = {
            who: mint(secret, f"fuzz-{label}-{who}", who.capitalize())
            for who in ("ana", "bia", "cid")
        }
        self.http = requests.Session()
        self.seated, self.seated_invite = self._table(joined_by="bia")
        self.waiting, self.invite = self._table(joined_by=None)
        self.finished: str | None = None
        self.tables = 2

    def header(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def _table(self, joined_by: str | None) -> tuple[str, str]:
        """A table ana created (and ``joined_by`` joined) that the chat has heard of."""
        created = self._post("/v1/tables", "ana", {})
        table_id, code = created["table_id"], created["invite_code"]
        if joined_by is not None:
            self._post(f"/v1/tables/{table_id}/join", joined_by, {"invite_code": code})
        deadline = time.monotonic() + 30
        # The chat learns tables from the table's events.
        while self.http.get(f"{self.chat}/v1/tables/{table_id}/messages").status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("the chat service never heard of the fuzz's table")
            time.sleep(0.05)
        return table_id, code

    def _post(self, path: str, who: str, body: Any) -> Any:
        r = self.http.post(f"{self.table}{path}", json=body, headers=self.header(who), timeout=10)
        assert r.status_code < 300, r.text
        return r.json()

    def keep_playing(self) -> None:
        """A seated table whose match the fuzz ended (a resign, a leave) is replaced, so the
        fuzz goes on meeting a hand in play; a joined waiting table too."""
        if self.view(self.seated)["status"] != "playing":
            self.finished = self.seated
            self.seated, self.seated_invite = self._table(joined_by="bia")
            self.tables += 1
        if self.view(self.waiting)["status"] != "waiting":
            self.waiting, self.invite = self._table(joined_by=None)
            self.tables += 1

    def view(self, table_id: str, who: str | None = None) -> Any:
        """The table's view, a seat's if ``who`` sits there."""
        headers = self.header(who) if who else {}
        view = self.http.get(f"{self.table}/v1/tables/{table_id}", headers=headers, timeout=10)
        assert view.status_code == 200, view.text
        return view.json()

    def chat_state(self, table_id: str) -> int:
        """The number of the table's last chat message (0 before the first)."""
        page = self.http.get(f"{self.chat}/v1/tables/{table_id}/messages?limit=100", timeout=10)
        assert page.status_code == 200, page.text
        return max((m["seq"] for m in page.json()), default=0)

    def table_state(self, table_id: str) -> tuple[int, int]:
        """The table's version and how many events it has (its public log)."""
        events = self.http.get(f"{self.table}/v1/tables/{table_id}/events", timeout=10)
        assert events.status_code == 200, events.text
        return int(self.view(table_id)["version"]), len(events.json())

    def state(self, table_id: str) -> tuple[int, int, int]:
        """The table's version, its number of events and its last chat message."""
        return (*self.table_state(table_id), self.chat_state(table_id))


def examples(max_examples: int) -> hypothesis.settings:
    """Hypothesis settings of a fuzz loop: deterministic (a red run replays anywhere), no
    deadline (a real service answers), large and slow examples allowed."""
    return hypothesis.settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[
            hypothesis.HealthCheck.too_slow,
            hypothesis.HealthCheck.data_too_large,
        ],
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each of schemathesis's items (one per operation of the document) a node id of its
    own. Its items carry the operation in their name only, and pytest 9 builds a function's
    node id from its original name and its parameters, so all of them got the test function's
    id; pytest-xdist, which hands items to its workers by node id, then ran only the first
    operation's (and ``-k``/node-id selection could not tell them apart)."""
    for item in items:
        if not isinstance(item, pytest.Function) or item.parent is None:
            continue
        label = item.name[len(item.originalname) :]
        if (
            item.nodeid.startswith("tests/fuzz/")
            and label.startswith("[")
            and "[" not in item.nodeid
        ):
            item._id = item.parent.id.child(item.originalname).with_params(label[1:-1])
