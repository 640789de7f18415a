"""The archive of ended tables (services/table/archive.py) against real PostgreSQL: a directory
store and a real S3-compatible server (moto's, as a process of its own)."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import msgspec
import pytest

from services.table import archive
from services.table.archive import ArchiveStore, DirectoryStore
from services.table.http import TABLES
from services.table.ws import ARCHIVED_REASON, CLOSE_ARCHIVED
from shared.infra.db import create_pool
from shared.infra.settings import Settings
from shared.infra.web import Refused
from tests.conftest import settings_of_their_own
from tests.e2e.processes import free_port
from tests.table.conftest import Api, Clock, all_events, open_api, play_to_the_end

AFTER_S = 3600.0  # the retention these tests archive with


@pytest.fixture
def own(settings: Settings) -> Iterator[Settings]:
    """A database of this test's own: the archive takes every ended table past the delay."""
    with settings_of_their_own(settings, f"archive{time.monotonic_ns() % 10**9}") as own:
        yield own


@pytest.fixture
async def arena(own: Settings, clock: Clock) -> AsyncIterator[tuple[Api, asyncpg.Pool]]:
    """The real table app on that database, and a pool on its schema."""
    async with open_api(own, clock=clock) as api:
        pool = await create_pool(own.database_url, "gin_table", 4)
        try:
            yield api, pool
        finally:
            await pool.close()


def at(clock: Clock) -> datetime:
    return datetime.fromtimestamp(clock.now, UTC)


async def ended_by_resign(api: Api) -> tuple[str, list[str]]:
    """A table whose match is over (one seat resigned): (table id, tokens)."""
    table_id, a, b = await api.table_for_two()
    view = await api.view(table_id)
    tokens = [a, b]
    status, body = await api.command(table_id, tokens[view["hand"]["to_act"]], type="resign")
    assert status == 200, body
    assert body["view"]["status"] == "match_over"
    return table_id, tokens


async def rows_of(pool: asyncpg.Pool, table_id: str) -> dict[str, int]:
    """How many rows each table of the schema with a table_id column holds of this table."""
    async with pool.acquire() as conn:
        names = await conn.fetch(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = 'gin_table'"
            " AND column_name = 'table_id' AND table_name NOT IN ('archived', 'timer_deadlines')"
        )
        return {
            n[0]: await conn.fetchval(f"SELECT count(*) FROM {n[0]} WHERE table_id = $1", table_id)
            for n in names
        }


def lines_of(data: bytes) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in gzip.decompress(data).splitlines()]


async def test_an_ended_table_past_the_delay_is_archived_whole_and_deleted(
    arena: tuple[Api, asyncpg.Pool], clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    store = DirectoryStore(tmp_path)
    finished, a, b = await api.table_for_two({"target": 30})
    await play_to_the_end(api, finished, [a, b], seed=3)
    events = await all_events(api, finished)
    hand_numbers = [e["data"]["hand"] for e in events if e["data"]["type"] == "hand_ended"]
    assert hand_numbers
    hands = [(await api.call("GET", f"/v1/tables/{finished}/hands/{n}"))[1] for n in hand_numbers]
    ended_at = at(clock)
    clock.advance(AFTER_S - 10)
    recent, _ = await ended_by_resign(api)  # ended, but not long enough ago
    playing, _, _ = await api.table_for_two()  # still playing, long idle
    clock.advance(20)
    assert await rows_of(pool, finished) != dict.fromkeys(await rows_of(pool, finished), 0)

    assert await archive.archive_due(pool, store, at(clock), AFTER_S, batch=10) == 1

    key = f"tables/{ended_at:%Y}/{ended_at:%m}/{finished}.jsonl.gz"
    lines = lines_of((tmp_path / key).read_bytes())
    header, table, *rest = lines
    assert header == {
        "format": "gin-table-archive",
        "version": 1,
        "table_id": finished,
        "archived_at": at(clock).isoformat().replace("+00:00", "Z"),
        "events": len(events),
        "hands": len(hands),
        "deadlines": 1,
    }
    assert table["kind"] == "table"
    assert (table["row"]["table_id"], table["row"]["status"]) == (finished, "match_over")
    assert table["row"]["state"].startswith("\\x")  # the engine state, bytes as hex
    assert [line["row"]["envelope"] for line in rest if line["kind"] == "event"] == events
    assert [line["row"]["record"] for line in rest if line["kind"] == "hand"] == hands
    assert [line["kind"] for line in rest] == ["event"] * len(events) + ["hand"] * len(hands) + [
        "deadline"
    ]
    commitments = [e["data"]["deck_commitment"] for e in events if "deck_commitment" in e["data"]]
    assert len(commitments) == len(hands)  # each hand's commitment, and its deck and salt

    assert set((await rows_of(pool, finished)).values()) == {0}
    async with pool.acquire() as conn:
        assert await archive.archived_location(conn, finished) == (tmp_path / key).as_uri()
        with pytest.raises(Refused) as refused:
            await archive.refuse_if_archived(conn, finished)
        assert (refused.value.status, refused.value.code) == (410, "archived")
        assert (tmp_path / key).as_uri() in refused.value.message
        await archive.refuse_if_archived(conn, recent)  # not archived: nothing raised
    for untouched in (recent, playing):
        assert (await api.call("GET", f"/v1/tables/{untouched}"))[0] == 200
    # Run again: nothing more is due.
    assert await archive.archive_due(pool, store, at(clock), AFTER_S, batch=10) == 0


async def test_an_archived_tables_routes_answer_410_with_its_place(
    arena: tuple[Api, asyncpg.Pool], clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    table_id, tokens = await ended_by_resign(api)
    assert table_id in api.client.app[TABLES].seatings  # this replica remembers it
    clock.advance(AFTER_S + 1)
    assert await archive.archive_due(pool, DirectoryStore(tmp_path), at(clock), AFTER_S, 10) == 1
    for path in ("", "/events", "/hands/1"):
        status, body = await api.call("GET", f"/v1/tables/{table_id}{path}")
        assert status == 410, (path, body)
        assert body["error"]["code"] == "archived"
        assert tmp_path.as_uri() in body["error"]["message"]
    status, body = await api.command(table_id, tokens[0], type="rematch")
    assert status == 410, body
    assert body["error"]["code"] == "archived"
    # a replica that remembered the table's seating upgrades, finds no row, and says why
    async with api.client.ws_connect(f"/v1/tables/{table_id}/ws") as ws:
        message = await ws.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.CLOSE, message
        assert (ws.close_code, message.extra) == (CLOSE_ARCHIVED, ARCHIVED_REASON)


async def test_an_archived_tables_socket_is_refused_with_410(
    arena: tuple[Api, asyncpg.Pool], own: Settings, clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    table_id, _ = await ended_by_resign(api)
    clock.advance(AFTER_S + 1)
    # Another replica (this one remembers the table's seating): it learns from the database.
    async with open_api(own, clock=clock) as other:
        assert await archive.archive_due(pool, DirectoryStore(tmp_path), at(clock), AFTER_S, 10)
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await other.client.ws_connect(f"/v1/tables/{table_id}/ws")
        assert refused.value.status == 410


async def test_restore_serves_the_table_again_with_the_same_events(
    arena: tuple[Api, asyncpg.Pool], clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    store = DirectoryStore(tmp_path)
    table_id, tokens = await ended_by_resign(api)
    events = await all_events(api, table_id)
    view = await api.view(table_id, tokens[0])
    before = await rows_of(pool, table_id)
    clock.advance(AFTER_S + 1)
    assert await archive.archive_due(pool, store, at(clock), AFTER_S, batch=10) == 1
    assert (await api.call("GET", f"/v1/tables/{table_id}"))[0] in (404, 410)

    header = await archive.restore(pool, store, table_id)

    assert (header.table_id, header.events) == (table_id, len(events))
    assert await all_events(api, table_id) == events
    assert await api.view(table_id, tokens[0]) == view
    assert await rows_of(pool, table_id) == {**before, "commands": 0}
    async with pool.acquire() as conn:
        assert await archive.archived_location(conn, table_id) is None
    with pytest.raises(archive.NotArchived):
        await archive.restore(pool, store, table_id)
    # Served again, it moves on (a rematch), and archives again to the same key once ended.
    clock.advance(1)
    status, body = await api.command(table_id, tokens[0], type="leave")
    assert status == 200, body
    clock.advance(AFTER_S + 1)
    assert await archive.archive_due(pool, store, at(clock), AFTER_S, batch=10) == 1


async def test_the_restore_command_reads_the_settings(
    arena: tuple[Api, asyncpg.Pool], own: Settings, clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    table_id, _ = await ended_by_resign(api)
    clock.advance(AFTER_S + 1)
    assert await archive.archive_due(pool, DirectoryStore(tmp_path), at(clock), AFTER_S, 10) == 1
    env = {
        "GIN_DATABASE_URL": own.database_url,
        "GIN_ARCHIVE_URL": tmp_path.as_uri(),
        "PATH": "/usr/bin:/bin",
    }
    command = [sys.executable, "-m", "services.table.archive", "restore", table_id]
    done = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert f"table {table_id} restored" in done.stdout
    assert (await api.call("GET", f"/v1/tables/{table_id}"))[0] == 200
    again = await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 1
    assert "is not archived" in again.stderr


@pytest.mark.parametrize("table_id", ["-2VkDUM5Ko79", "--", "-h_x", "A"])
def test_the_restore_command_takes_an_id_that_begins_with_a_dash(
    table_id: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # One id in 64 begins with "-"; it reaches the restore (here: no archive is configured).
    monkeypatch.setenv("GIN_ARCHIVE_URL", "")
    assert archive.main(["restore", table_id]) == 2
    assert "GIN_ARCHIVE_URL is empty" in capsys.readouterr().err


@pytest.mark.parametrize("table_id", ["../tables", "a b", "x" * 65, "", "caf\u00e9"])
def test_the_restore_command_refuses_what_is_not_a_table_id(
    table_id: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GIN_ARCHIVE_URL", "file:///nowhere")
    with pytest.raises(SystemExit) as exited:
        archive.main(["restore", table_id])
    assert exited.value.code == 2
    assert "is not a table id" in capsys.readouterr().err


class FailingStore(DirectoryStore):
    """A store whose writes fail (a bucket away, a disk full)."""

    async def put(self, key: str, data: bytes) -> None:
        raise OSError("the archive is away")


class LyingStore(DirectoryStore):
    """A store that reads back other bytes than were written."""

    async def get(self, key: str) -> bytes:
        return (await super().get(key))[:-1]


@pytest.mark.parametrize("store_kind", [FailingStore, LyingStore])
async def test_a_record_not_written_whole_deletes_nothing(
    arena: tuple[Api, asyncpg.Pool], clock: Clock, tmp_path: Path, store_kind: type
) -> None:
    api, pool = arena
    table_id, _ = await ended_by_resign(api)
    before = await rows_of(pool, table_id)
    clock.advance(AFTER_S + 1)
    with pytest.raises((OSError, archive.NotReadBack)):
        await archive.archive_due(pool, store_kind(tmp_path), at(clock), AFTER_S, batch=10)
    assert await rows_of(pool, table_id) == before
    assert (await api.call("GET", f"/v1/tables/{table_id}"))[0] == 200
    async with pool.acquire() as conn:
        assert await archive.archived_location(conn, table_id) is None


class GatedStore(DirectoryStore):
    """A store whose writes wait for the test to open the gate."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writing = asyncio.Event()
        self.gate = asyncio.Event()

    async def put(self, key: str, data: bytes) -> None:
        self.writing.set()
        await self.gate.wait()
        await super().put(key, data)


async def test_moves_go_on_while_a_table_is_archived_and_a_locked_table_is_skipped(
    arena: tuple[Api, asyncpg.Pool], clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    ended, _ = await ended_by_resign(api)
    locked, _ = await ended_by_resign(api)
    playing, a, b = await api.table_for_two()
    clock.advance(AFTER_S + 1)
    store = GatedStore(tmp_path)
    holder = await pool.acquire()
    try:
        # A move's lock on one ended table (a leave, say): the archive does not wait for it.
        holder_tx = holder.transaction()
        await holder_tx.start()
        await holder.execute("SELECT FROM tables WHERE table_id = $1 FOR UPDATE", locked)
        archiving = asyncio.create_task(
            archive.archive_due(pool, store, at(clock), AFTER_S, batch=10)
        )
        await asyncio.wait_for(store.writing.wait(), 10)
        # Meanwhile another table plays on.
        view = await api.view(playing)
        tokens = [a, b]
        status, body = await api.command(
            playing, tokens[view["hand"]["to_act"]], type="pass_upcard"
        )
        assert status == 200, body
        store.gate.set()
        assert await asyncio.wait_for(archiving, 10) == 1
        await holder_tx.rollback()
    finally:
        await pool.release(holder)
    assert set((await rows_of(pool, ended)).values()) == {0}
    assert (await api.call("GET", f"/v1/tables/{locked}"))[0] == 200
    assert (await api.call("GET", f"/v1/tables/{playing}"))[0] == 200
    # Once free, the skipped table goes at the next run.
    assert await archive.archive_due(pool, store, at(clock), AFTER_S, batch=10) == 1


def test_a_record_not_whole_is_refused() -> None:
    rows = archive.Rows(table='{"table_id": "t"}', events=['{"seq": 1}'], hands=[], deadlines=[])
    data = archive.encode_record("t", datetime(2027, 1, 1, tzinfo=UTC), rows)
    assert archive.decode_record(data).rows == rows
    assert archive.encode_record("t", datetime(2027, 1, 1, tzinfo=UTC), rows) == data
    cut = gzip.compress(b"\n".join(gzip.decompress(data).splitlines()[:-1]))
    with pytest.raises(archive.BadRecord, match="not whole"):
        archive.decode_record(cut)
    with pytest.raises(archive.BadRecord):
        archive.decode_record(b"not gzip")
    newer = gzip.decompress(data).replace(b'"version":1', b'"version":2')
    with pytest.raises(archive.BadRecord, match="not gin-table-archive 1"):
        archive.decode_record(gzip.compress(newer))


def test_the_archive_url_names_the_store(tmp_path: Path) -> None:
    assert archive.store_of("") is None
    store = archive.store_of(tmp_path.as_uri())
    assert isinstance(store, DirectoryStore)
    key = "tables/2027/01/t.jsonl.gz"
    assert store.location(key) == f"{tmp_path.as_uri()}/{key}"
    with pytest.raises(ValueError, match="GIN_ARCHIVE_URL"):
        archive.store_of("gs://bucket")


# --- a real S3-compatible server --------------------------------------------------------------


def _read_object(endpoint: str, bucket: str, key: str) -> bytes:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server as a process of its own on a free port, stopped at the end."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:  # pragma: no cover - moto is in the dev lock
        pytest.skip(f"moto[s3] and flask are not installed: {exc}")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None, "moto's server stopped"
                assert time.monotonic() < deadline, "moto's server did not answer"
                time.sleep(0.1)
        yield endpoint
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def bucket_url(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket's URL with a prefix; the client configured as in production, by AWS_*."""
    name = f"gin-archive-{time.monotonic_ns()}"
    request = urllib.request.Request(f"{s3_endpoint}/{name}", method="PUT")
    urllib.request.urlopen(request, timeout=5).close()
    for variable, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }.items():
        monkeypatch.setenv(variable, value)
    return f"s3://{name}/gin"


async def test_the_s3_store_against_a_real_s3_server(
    arena: tuple[Api, asyncpg.Pool], clock: Clock, bucket_url: str, s3_endpoint: str
) -> None:
    api, pool = arena
    store: ArchiveStore | None = archive.store_of(bucket_url)
    assert isinstance(store, archive.BucketStore)
    with pytest.raises(FileNotFoundError):
        await store.get("tables/none.jsonl.gz")
    table_id, _ = await ended_by_resign(api)
    events = await all_events(api, table_id)
    ended_at = at(clock)
    clock.advance(AFTER_S + 1)

    assert await archive.archive_due(pool, store, at(clock), AFTER_S, batch=10) == 1

    key = f"tables/{ended_at:%Y}/{ended_at:%m}/{table_id}.jsonl.gz"
    location = f"{bucket_url}/{key}"
    async with pool.acquire() as conn:
        assert await archive.archived_location(conn, table_id) == location
    # The object, as another S3 client (boto3, moto's own) sees it.
    bucket = bucket_url.removeprefix("s3://").split("/")[0]
    lines = lines_of(await asyncio.to_thread(_read_object, s3_endpoint, bucket, f"gin/{key}"))
    assert [line["row"]["envelope"] for line in lines if line.get("kind") == "event"] == events

    await archive.restore(pool, store, table_id)
    assert await all_events(api, table_id) == events


async def test_the_maintenance_step_archives_by_the_settings(
    arena: tuple[Api, asyncpg.Pool], own: Settings, clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    assert archive.archive_step(pool, own) is None  # GIN_ARCHIVE_URL empty: nothing archived
    settings = msgspec.structs.replace(
        own, archive_url=tmp_path.as_uri(), archive_after_s=AFTER_S, maintenance_batch=2
    )
    step = archive.archive_step(pool, settings)
    assert step is not None
    for _ in range(3):
        await ended_by_resign(api)
    clock.advance(AFTER_S + 1)
    async with pool.acquire() as conn:
        assert [await step(conn, at(clock)) for _ in range(3)] == [2, 1, 0]
    records = await asyncio.to_thread(lambda: list(tmp_path.rglob("*.jsonl.gz")))
    assert len(records) == 3


def records(root: Path) -> list[Path]:
    """The archive's records under ``root``."""
    return list(root.rglob("*.jsonl.gz"))


def names_in(root: Path, *needles: str) -> list[str]:
    """The records under ``root`` (gunzipped) in which any of ``needles`` appears."""
    found = []
    for path in records(root):
        text = gzip.decompress(path.read_bytes()).decode()
        if any(needle in text for needle in needles):
            found.append(str(path.relative_to(root)))
    return found


async def test_an_erasure_reaches_the_archive(
    arena: tuple[Api, asyncpg.Pool], own: Settings, clock: Clock, tmp_path: Path
) -> None:
    """A person who sat at an archived table asks to be erased: the table is restored, erased
    as any other (its seat the pseudonym), and its old record, which named the person, is
    deleted; archived again later, its record names nobody."""
    api, pool = arena
    subject, name = f"sub-arquivada-{time.monotonic_ns()}", "Ana Arquivada"
    ana, bia = api.token(name, subject), api.token("Bia")
    created = await api.create(ana)
    table_id = created["table_id"]
    status, body = await api.call(
        "POST", f"/v1/tables/{table_id}/join", bia, {"invite_code": created["invite_code"]}
    )
    assert status == 200, body
    to_act = (await api.view(table_id))["hand"]["to_act"]
    status, body = await api.command(table_id, [ana, bia][to_act], type="resign")
    assert status == 200, body
    clock.advance(AFTER_S + 1)
    store = DirectoryStore(tmp_path)
    assert await archive.archive_due(pool, store, at(clock), AFTER_S, 10) == 1
    assert len(names_in(tmp_path, subject, name)) == 1  # the record names her
    async with pool.acquire() as conn:
        assert await conn.fetchval(
            "SELECT players FROM archived WHERE table_id = $1", table_id
        ) == [subject, body["view"]["seats"][1]["id"]]

    site_settings = msgspec.structs.replace(own, archive_url=tmp_path.as_uri())
    async with open_api(site_settings, clock=clock) as site:
        status, _ = await site.call("DELETE", "/v1/players/me", ana)
        assert status == 204
        status, view = await site.call("GET", f"/v1/tables/{table_id}")
        assert status == 200, view  # restored, and erased there
        assert view["seats"][0]["name"] == "Jogador removido"
        assert subject not in msgspec.json.encode(view).decode()
        assert (await site.call("DELETE", "/v1/players/me", ana))[0] == 204  # nothing left
    assert names_in(tmp_path, subject, name) == []  # the old record is gone
    async with pool.acquire() as conn:
        assert await archive.archived_location(conn, table_id) is None

    clock.advance(AFTER_S + 1)  # archived again: a record that names nobody
    assert await archive.archive_due(pool, store, at(clock), AFTER_S, 10) == 1
    assert records(tmp_path)
    assert names_in(tmp_path, subject, name) == []


async def test_an_erasure_with_the_archive_away_erases_nothing_and_says_so(
    arena: tuple[Api, asyncpg.Pool], own: Settings, clock: Clock, tmp_path: Path
) -> None:
    api, pool = arena
    table_id, tokens = await ended_by_resign(api)
    clock.advance(AFTER_S + 1)
    assert await archive.archive_due(pool, DirectoryStore(tmp_path), at(clock), AFTER_S, 10) == 1
    (record,) = records(tmp_path)
    record.rename(record.with_suffix(".moved"))  # the record cannot be read
    site_settings = msgspec.structs.replace(own, archive_url=tmp_path.as_uri())
    async with open_api(site_settings, clock=clock) as site:
        status, body = await site.call("DELETE", "/v1/players/me", tokens[0])
        assert status == 503, body
        assert body["error"]["code"] == "archive_unavailable"
    async with pool.acquire() as conn:
        assert await archive.archived_location(conn, table_id) is not None  # still archived
