"""HTTP answers gzipped for clients that accept it (shared/infra/compression.py), with the
real table app: a page's catch-up of a table's log comes several times smaller, the same
JSON once decoded; small answers, clients that do not accept gzip and sockets are left as
they were."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from shared.infra.compression import MIN_BYTES, accepts_gzip
from shared.infra.settings import Settings
from tests.table.conftest import Api, open_api, play_to_the_end, ws_receive

BROWSER = "gzip, deflate, br, zstd"  # what Chromium and Firefox send


@pytest.mark.parametrize(
    ("accept", "gzip_ok"),
    [
        (BROWSER, True),
        ("GZIP", True),
        ("x-gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("deflate, *;q=0.1", True),
        ("", False),
        ("identity", False),
        ("br, deflate", False),
        ("gzip;q=0", False),
        ("gzip;q=0.000", False),
        ("*, gzip;q=0", False),
        ("gzip;q=lots", False),
        ("*;q=0", False),
    ],
)
def test_which_clients_accept_gzip(accept: str, gzip_ok: bool) -> None:
    assert accepts_gzip(accept) is gzip_ok


@pytest.fixture
async def raw(api: Api) -> AsyncIterator[aiohttp.ClientSession]:
    """A client that leaves the answers' bodies as they came (no decompression)."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def test_a_tables_log_comes_gzipped_and_decodes_to_the_same_json(
    api: Api, raw: aiohttp.ClientSession
) -> None:
    table_id, ana, bia = await api.table_for_two({"target": 100})
    await play_to_the_end(api, table_id, [ana, bia], seed=3)
    url = api.client.make_url(f"/v1/tables/{table_id}/events?after=0")
    async with raw.get(url, headers={"Accept-Encoding": "identity"}) as r:
        assert r.status == 200
        plain = await r.read()
        assert "Content-Encoding" not in r.headers
        assert r.headers["Vary"] == "Accept-Encoding"
    assert len(plain) >= MIN_BYTES
    async with raw.get(url, headers={"Accept-Encoding": BROWSER}) as r:
        assert r.status == 200
        assert r.headers["Content-Encoding"] == "gzip"
        assert r.headers["Vary"] == "Accept-Encoding"
        packed = await r.read()
        assert int(r.headers["Content-Length"]) == len(packed)
    assert msgspec.json.decode(gzip.decompress(packed)) == msgspec.json.decode(plain)
    assert len(packed) * 3 < len(plain), (len(packed), len(plain))


async def test_a_move_a_view_and_a_refusal_go_plain(api: Api, raw: aiohttp.ClientSession) -> None:
    """A command's answer and a view (a few KB) fit in a connection's first flight of packets
    either way: gzipping them would cost the table's CPU on every move for nothing."""
    headers = {"Accept-Encoding": BROWSER}
    table_id, ana, bia = await api.table_for_two()
    seated = {**headers, "Authorization": f"Bearer {ana}"}
    async with raw.get(api.client.make_url(f"/v1/tables/{table_id}"), headers=seated) as r:
        assert r.status == 200
        assert "Content-Encoding" not in r.headers
        view = msgspec.json.decode(await r.read())
    move = {**view["legal"][0], "command_id": "c-1"} if view["legal"] else None
    if move is None:  # the other seat decides first: its move
        move = {**(await api.view(table_id, bia))["legal"][0], "command_id": "c-1"}
        seated["Authorization"] = f"Bearer {bia}"
    url = api.client.make_url(f"/v1/tables/{table_id}/commands")
    async with raw.post(url, json=move, headers=seated) as r:
        assert r.status == 200, await r.text()
        assert "Content-Encoding" not in r.headers
    async with raw.get(api.client.make_url("/healthz"), headers=headers) as r:
        assert r.status == 200
        assert "Content-Encoding" not in r.headers
        assert "Vary" not in r.headers
    async with raw.get(api.client.make_url("/v1/tables/nope"), headers=headers) as r:
        assert r.status == 404
        assert "Content-Encoding" not in r.headers
        assert (await r.json())["error"]["code"] == "no_such_table"


async def test_a_socket_of_a_client_that_accepts_gzip_is_served(api: Api) -> None:
    """Browsers send Accept-Encoding on the upgrade too: the socket is no ``Response``."""
    table_id, ana, _ = await api.table_for_two()
    async with api.client.ws_connect(
        f"/v1/tables/{table_id}/ws?token={ana}", headers={"Accept-Encoding": BROWSER}
    ) as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"


async def test_gzip_can_be_turned_off(settings: Settings) -> None:
    off = msgspec.structs.replace(settings, http_gzip=False)
    async with open_api(off) as api, aiohttp.ClientSession(auto_decompress=False) as session:
        table_id, ana, bia = await api.table_for_two({"target": 100})
        await play_to_the_end(api, table_id, [ana, bia], seed=3)
        url = api.client.make_url(f"/v1/tables/{table_id}/events?after=0")
        async with session.get(url, headers={"Accept-Encoding": BROWSER}) as r:
            assert r.status == 200
            assert "Content-Encoding" not in r.headers
            assert len(await r.read()) >= MIN_BYTES
