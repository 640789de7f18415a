"""The table's budget of open files (issue 27, item 6): a new WebSocket is closed at once with
1013 while the process has more files open than its limit less ``GIN_FILES_RESERVE``; the
sockets already open go on, plain HTTP still answers, and once files are free a socket is
admitted again. Against the real app, and against a real process at a real, small limit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from services.table.app import create_app
from services.table.ws import CLOSE_TRY_AGAIN_LATER, FILES, HUB, TRY_AGAIN_REASON
from shared.infra.files import FileBudget
from shared.infra.settings import Settings
from tests.infra.test_files import LimitedService, limited, metric
from tests.table.conftest import Api, Clock, SeededShuffle, serving, ws_receive, ws_until


def ws_path(table_id: str, token: str | None = None) -> str:
    return f"/v1/tables/{table_id}/ws" + (f"?token={token}" if token else "")


async def refused_with(ws: Any) -> tuple[int | None, str]:
    """The close code and reason of a socket the server closes before any frame."""
    msg = await asyncio.wait_for(ws.receive(), 10)
    assert msg.type == aiohttp.WSMsgType.CLOSE, msg
    return ws.close_code, msg.extra


async def first_move(api: Api, table_id: str, tokens: dict[int, str]) -> None:
    """The seat to act sends its first legal command over plain HTTP."""
    seat = (await api.view(table_id))["hand"]["to_act"]
    view = await api.view(table_id, tokens[seat])
    status, body = await api.command(table_id, tokens[seat], command_id="m1", **view["legal"][0])
    assert status == 200, body


def refused_count(text: str, reason: str = "files") -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "gin_websockets_refused_total"
                and sample.labels.get("reason") == reason
            ):
                return float(sample.value)
    return 0.0


async def test_a_socket_past_the_budget_is_closed_with_1013_and_the_rest_go_on(
    settings: Settings, tmp_path: Path
) -> None:
    """The budget counts a directory here (by listing it, at every socket), so the test sets
    how many files are open: 10, then 16 past a ceiling of 15, then 15 again."""
    fds = tmp_path / "fd"
    fds.mkdir()
    for n in range(10):
        (fds / str(n)).touch()
    app = create_app(settings, clock=Clock(), shuffle=SeededShuffle(7))
    app[FILES] = FileBudget(20, 5, fd_dir=fds, by_size=False, relist_s=0.0)
    async with serving(app) as client:
        api = Api(client, settings)
        table_id, ana, bia = await api.table_for_two()
        watching = await client.ws_connect(ws_path(table_id, ana))
        assert (await ws_receive(watching))["kind"] == "snapshot"

        for n in range(10, 16):
            (fds / str(n)).touch()
        refused = await client.ws_connect(ws_path(table_id, bia))
        assert await refused_with(refused) == (CLOSE_TRY_AGAIN_LATER, TRY_AGAIN_REASON)
        spectator = await client.ws_connect(ws_path(table_id))
        assert await refused_with(spectator) == (CLOSE_TRY_AGAIN_LATER, TRY_AGAIN_REASON)

        # Plain HTTP answers, and the socket already open gets the move it made.
        positions = {(await api.view(table_id, t))["you"]: t for t in (ana, bia)}
        await first_move(api, table_id, positions)
        got = await ws_until(watching, lambda ms: any(m["kind"] == "event" for m in ms))
        assert got[-1]["event"]["seq"] > 0
        await watching.send_str(msgspec.json.encode({"kind": "nonsense"}).decode())
        assert (await ws_receive(watching))["kind"] == "error"  # it reads and answers too

        async with client.get(ws_path(table_id)) as r:  # a plain GET: 400, as ever
            assert r.status == 400, await r.text()
        async with client.get("/metrics") as r:
            assert refused_count(await r.text()) == 2

        (fds / "15").unlink()  # at the ceiling again: admitted
        again = await client.ws_connect(ws_path(table_id, bia))
        assert (await ws_receive(again))["kind"] == "snapshot"
        await again.close()
        await watching.close()


async def test_a_socket_past_max_sockets_is_closed_with_1013_and_room_is_made_again(
    settings: Settings,
) -> None:
    """GIN_MAX_SOCKETS bounds a replica's sockets whatever its files: its memory binds first
    once the file limit is raised. Past it a socket is closed with 1013 (counted with the
    reason sockets), the open ones go on, and one closing makes room."""
    limited_settings = msgspec.structs.replace(settings, max_sockets=2)
    app = create_app(limited_settings, clock=Clock(), shuffle=SeededShuffle(7))
    async with serving(app) as client:
        api = Api(client, limited_settings)
        table_id, ana, bia = await api.table_for_two()
        first = await client.ws_connect(ws_path(table_id, ana))
        assert (await ws_receive(first))["kind"] == "snapshot"
        second = await client.ws_connect(ws_path(table_id))
        assert (await ws_receive(second))["kind"] == "snapshot"
        third = await client.ws_connect(ws_path(table_id, bia))
        assert await refused_with(third) == (CLOSE_TRY_AGAIN_LATER, TRY_AGAIN_REASON)
        async with client.get("/metrics") as r:
            text = await r.text()
        assert refused_count(text, "sockets") == 1
        assert refused_count(text, "files") == 0

        positions = {(await api.view(table_id, t))["you"]: t for t in (ana, bia)}
        await first_move(api, table_id, positions)
        got = await ws_until(first, lambda ms: any(m["kind"] == "event" for m in ms))
        assert got[-1]["event"]["seq"] > 0

        await second.close()
        for _ in range(100):  # the server takes the closed socket off its hub
            if app[HUB].sockets < 2:
                break
            await asyncio.sleep(0.02)
        again = await client.ws_connect(ws_path(table_id, bia))
        assert (await ws_receive(again))["kind"] == "snapshot"
        await again.close()
        await first.close()


async def test_a_table_process_at_its_file_limit_refuses_sockets_with_1013(
    settings: Settings, tmp_path: Path
) -> None:
    """A table process started at soft 64 / hard 400 files with 300 in reserve raises its
    limit to 400 and takes sockets while it has at most 100 files open; the next is closed
    with 1013, the open ones and plain HTTP go on, and closing some makes room again."""
    async with limited(
        "services.table", settings, 64, 400, tmp_path / "table.log", GIN_FILES_RESERVE="300"
    ) as table:
        assert await metric(table.base, "process_max_fds") == 400
        base_files = table.open_files()
        assert base_files < 90, f"the table holds {base_files} files idle: raise the test's limit"
        # No limit on the session's connections (aiohttp's is 100, sockets included).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            api = Api(_Prefixed(session, table.base), settings)  # type: ignore[arg-type]
            table_id, ana, bia = await api.table_for_two()
            url = f"{table.base}{ws_path(table_id)}"
            sockets = []
            refusal: tuple[int | None, str] | None = None
            for _ in range(400):
                ws = await session.ws_connect(url)
                msg = await asyncio.wait_for(ws.receive(), 10)
                if msg.type == aiohttp.WSMsgType.CLOSE:
                    refusal = (ws.close_code, msg.extra)
                    break
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                sockets.append(ws)
            assert refusal == (CLOSE_TRY_AGAIN_LATER, TRY_AGAIN_REASON), table.tail()
            assert 100 - base_files <= len(sockets) + 10, (len(sockets), base_files)
            assert table.open_files() <= 110, "the reserve is kept free"

            async with session.get(f"{table.base}/healthz") as r:
                assert r.status == 200
            positions = {(await api.view(table_id, t))["you"]: t for t in (ana, bia)}
            await first_move(api, table_id, positions)
            got = await ws_until(sockets[0], lambda ms: any(m["kind"] == "event" for m in ms))
            assert got[-1]["event"]["seq"] > 0
            assert await metric(table.base, "gin_websockets_refused_total", reason="files") == 1

            for ws in sockets[-20:]:
                await ws.close()
            await files_under(table, 90)
            again = await session.ws_connect(url)
            assert (await ws_receive(again))["kind"] == "snapshot"
            for ws in [*sockets[:-20], again]:
                await ws.close()
        past = table.lines("open_files_past_ceiling")
        assert [(x["ceiling"], x["limit"]) for x in past] == [(100, 400)]
        assert len(table.lines("open_files_under_ceiling")) == 1


async def files_under(table: LimitedService, most: int, within_s: float = 10.0) -> None:
    """Wait until the process has at most ``most`` files open (its closes are done)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while table.open_files() > most:
        assert asyncio.get_running_loop().time() < deadline, table.open_files()
        await asyncio.sleep(0.05)


class _Prefixed:
    """A session that answers ``request(method, path)`` on one base URL, as a TestClient."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.session.request(method, self.base + path, **kwargs)
