"""No answered move is lost, and no socket sees an event that is not in the log, while the
table service is restarted (SIGTERM, then a new process on the same port) at any moment of
several matches: right after a move is answered, and with commands in flight.

Two people play each table over HTTP as the reference page does: each command carries a
``command_id`` and the ``expected_version`` of the view its sender was last answered (a
command whose outcome is unknown, the connection lost or a 503, is sent again with the same
id). So a move answered 2xx and then lost shows as a refusal of the next one ("draw a card
first", or a stale version), and as a table version short of the moves answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shared.infra.auth import mint
from shared.infra.settings import Settings
from tests.conftest import settings_of_their_own
from tests.e2e.processes import Service
from tests.moves import sobra_move

pytestmark = pytest.mark.slow

TABLES = 6
RESTARTS = 12
# Events of other streams than the table's own (chat, timers): not in its log.
OTHER_STREAMS = {"message_posted", "absence_claimable", "turn_reminder"}


class Restarting:
    """The table service as a process, restarted on the same port on demand."""

    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.n = 0
        self.service = self._start(None)

    def _start(self, port: int | None) -> Service:
        self.n += 1
        return Service(
            "services.table", self.settings, port=port, log_to=self.logs / f"table-{self.n}.log"
        )

    @property
    def base(self) -> str:
        return self.service.base

    async def restart(self) -> None:
        """SIGTERM, wait for the old process to exit (0: a clean drain), start a new one."""
        old = self.service
        old.terminate()
        code = await asyncio.to_thread(old.proc.wait, 30)
        assert code == 0, f"the table service exited with {code}"
        old.stop()
        self.service = self._start(old.port)
        await self.service.ready()


class Seat:
    def __init__(self, token: str, seat: int) -> None:
        self.token = token
        self.seat = seat


async def send(
    session: aiohttp.ClientSession, svc: Restarting, path: str, token: str, body: dict[str, Any]
) -> tuple[int, Any]:
    """POST until answered (a lost connection or a 503 is sent again, the same body)."""
    for _ in range(600):
        try:
            async with session.post(
                f"{svc.base}{path}",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
                timeout=aiohttp.ClientTimeout(total=15),
            ) as r:
                data = await r.json(content_type=None)
                if r.status not in (502, 503, 504):
                    return r.status, data
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"no answer to {body}")


async def get(session: aiohttp.ClientSession, svc: Restarting, path: str, token: str) -> Any:
    for _ in range(600):
        try:
            async with session.get(
                f"{svc.base}{path}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=aiohttp.ClientTimeout(total=15),
            ) as r:
                if r.status == 200:
                    return await r.json()
                assert r.status in (502, 503, 504), (r.status, await r.text())
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"no answer to GET {path}")


class Watch:
    """A seat's table socket, reconnected whenever it closes; every event it was sent."""

    def __init__(self) -> None:
        self.events: dict[int, str] = {}  # seq -> envelope id
        self.twice: list[tuple[int, str, str]] = []
        self.views: list[tuple[int, int]] = []  # (event seq, version of the view sent with it)
        self.snapshots: list[int] = []

    async def run(
        self, session: aiohttp.ClientSession, svc: Restarting, table: str, token: str
    ) -> None:
        while True:
            try:
                url = f"{svc.base}/v1/tables/{table}/ws?token={token}"
                async with session.ws_connect(url) as ws:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            continue
                        frame = msg.json()
                        if frame["kind"] == "snapshot":
                            self.snapshots.append(frame["view"]["version"])
                        elif frame["kind"] == "event":
                            event = frame["event"]
                            if event["type"] in OTHER_STREAMS:
                                continue
                            known = self.events.setdefault(event["seq"], event["id"])
                            if known != event["id"]:
                                self.twice.append((event["seq"], known, event["id"]))
                            self.views.append((event["seq"], frame["view"]["version"]))
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass
            await asyncio.sleep(0.05)


class Match:
    """One table played by two people; what each answered move said."""

    def __init__(self, table: str, seats: list[Seat]) -> None:
        self.table = table
        self.seats = seats
        self.answered: dict[str, dict[str, Any]] = {}  # command_id -> result
        self.refused: list[str] = []
        self.lost: list[str] = []
        self.watches = [Watch(), Watch()]

    async def play(
        self,
        session: aiohttp.ClientSession,
        svc: Restarting,
        done: asyncio.Event,
        drawn: asyncio.Event,
    ) -> None:
        """Play until ``done`` (or the match ends); ``drawn`` is set at each draw answered."""
        path = f"/v1/tables/{self.table}"
        view = await get(session, svc, path, self.seats[0].token)
        while not done.is_set():
            if view["status"] != "playing" or view["hand"] is None:
                return
            seat = self.seats[view["hand"]["to_act"]]
            if view["you"] != seat.seat:  # the other seat's turn: its own view, read now
                before = view["version"]
                view = await get(session, svc, path, seat.token)
                if view["version"] < before or view["hand"]["to_act"] != seat.seat:
                    self.lost.append(f"read version {view['version']} after {before} answered")
                    return
            move = sobra_move(view)
            command_id = uuid.uuid4().hex
            body = {**move, "command_id": command_id, "expected_version": view["version"]}
            status, result = await send(session, svc, f"{path}/commands", seat.token, body)
            if status >= 300:
                self.refused.append(
                    f"{move} at version {view['version']} by seat {seat.seat}: {status} {result}"
                )
                return
            self.answered[command_id] = result
            view = result["view"]
            if move["type"] == "draw":
                drawn.set()

    async def check(self, session: aiohttp.ClientSession, svc: Restarting) -> None:
        token = self.seats[0].token
        log = await get(session, svc, f"/v1/tables/{self.table}/events?after=0", token)
        logged = {e["seq"]: e["id"] for e in log}
        assert sorted(logged) == list(range(1, len(logged) + 1)), "the log has a gap"
        view = await get(session, svc, f"/v1/tables/{self.table}", token)
        assert not self.refused, self.refused
        assert not self.lost, self.lost
        for command_id, result in self.answered.items():
            for event in result["events"]:
                assert logged.get(event["seq"]) == event["id"], (
                    f"answered move {command_id} (version {result['version']}): event"
                    f" {event['seq']} {event['type']} is not in the log"
                )
        # create (1), join (2), then one version per move answered: none lost, none twice
        assert view["version"] == 2 + len(self.answered)
        for watch in self.watches:
            assert not watch.twice, watch.twice
            for seq, event_id in watch.events.items():
                assert logged.get(seq) == event_id, f"a socket saw event {seq}, not in the log"
            assert all(version <= view["version"] for _, version in watch.views)
            assert all(version <= view["version"] for version in watch.snapshots)


@pytest.fixture
def own(settings: Settings) -> Iterator[Settings]:
    """A database and broker prefix of the test's own: its relay publishes only its rows."""
    with settings_of_their_own(settings, "restarts") as own:
        yield own


@pytest.mark.timeout(300)
async def test_every_answered_move_survives_restarts_mid_match(
    own: Settings, tmp_path: Path
) -> None:
    svc = Restarting(own, tmp_path)
    try:
        await svc.service.ready()
        async with aiohttp.ClientSession() as session:
            matches = []
            for i in range(TABLES):
                tokens = [
                    mint(own.auth_secret, f"ana-{i}", "Ana"),
                    mint(own.auth_secret, f"bia-{i}", "Bia"),
                ]
                status, created = await send(
                    session, svc, "/v1/tables", tokens[0], {"options": {"target": 500}}
                )
                assert status == 201, created
                status, joined = await send(
                    session,
                    svc,
                    f"/v1/tables/{created['table_id']}/join",
                    tokens[1],
                    {"invite_code": created["invite_code"]},
                )
                assert status == 200, joined
                matches.append(Match(created["table_id"], [Seat(tokens[0], 0), Seat(tokens[1], 1)]))
            watchers = [
                asyncio.create_task(w.run(session, svc, m.table, m.seats[k].token))
                for m in matches
                for k, w in enumerate(m.watches)
            ]
            done, drawn = asyncio.Event(), asyncio.Event()
            players = [asyncio.create_task(m.play(session, svc, done, drawn)) for m in matches]
            rng = random.Random(7)
            for i in range(RESTARTS):
                if i % 2:  # at a random moment: commands in flight, or not
                    await asyncio.sleep(rng.uniform(0.0, 0.5))
                else:  # right after a draw is answered (its discard comes next)
                    drawn.clear()
                    with contextlib.suppress(TimeoutError):  # every match ended, or refused
                        await asyncio.wait_for(drawn.wait(), 10)
                if all(p.done() for p in players):
                    break
                await svc.restart()
            await asyncio.sleep(0.5)  # a few moves more on the last process
            done.set()
            await asyncio.gather(*players)
            await asyncio.sleep(1.0)  # the sockets' last events
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            for match in matches:
                await match.check(session, svc)
            assert svc.n > 1, "the service was never restarted"
    finally:
        svc.service.stop()
