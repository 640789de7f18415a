"""The archive of ended tables (issue 32): a table finished, closed or expired whose last move
is older than ``GIN_ARCHIVE_AFTER_S`` leaves PostgreSQL for an archive (``GIN_ARCHIVE_URL``:
a directory, ``file:///dir``, or an S3 bucket, ``s3://bucket/prefix``), and its routes answer
``410 archived`` saying where it went, until it is restored.

A table's record is gzip-compressed JSON Lines, one JSON object a line (format 1):

1. a header: ``{"format": "gin-table-archive", "version": 1, "table_id", "archived_at",
   "events", "hands", "deadlines"}`` (the last three: how many lines of each kind follow);
2. ``{"kind": "table", "row": {...}}``: the ``tables`` row;
3. ``{"kind": "event", "row": {...}}`` for each event, by seq: the log, with each hand's deck
   commitment (``hand_started``'s ``deck_commitment``);
4. ``{"kind": "hand", "row": {...}}`` for each finished hand, by number: its record, with the
   deck and salt that open that commitment (R11.3);
5. ``{"kind": "deadline", "row": {...}}``: its ``deadlines`` row, if it has one.

Each ``row`` is the row as PostgreSQL's ``to_jsonb`` writes it: its columns by name, a
``jsonb`` column as JSON, a ``bytea`` one (the engine state) as ``"\\x<hex>"``, a time in ISO
8601. A restore writes each row back by its column names, so a column added later is left to
its default and a record stays readable across migrations. Commands' stored answers (kept
for retries only) and the outbox (published, kept for replays) are not in it: their own
retention removes them long before.

Each table moves on its own: its rows are read in one snapshot, the record is written and
read back, and only then, in a short transaction that takes the table row's lock with SKIP
LOCKED (a move holding it is never waited for) and finds the row unchanged, are its rows
deleted and its tombstone (``archived``) written. A failure anywhere before that deletes
nothing, and the next run writes the same key again.

Restore (docs: deploy/README.md, "Archive"): ``python -m services.table.archive restore ID``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import unquote, urlsplit

import asyncpg
import msgspec
import obstore
import structlog
from obstore.store import S3Store

from shared.infra.db import Conn, create_pool
from shared.infra.settings import Settings
from shared.infra.web import TABLE_ID, Refused

log = structlog.get_logger()

FORMAT = "gin-table-archive"
VERSION = 1
# The statuses of an ended table: a match over (not rematched), closed (R10.1) or expired
# (R10.3). Written out in the queries, so the planner matches the partial index of 013.
ENDED = ("match_over", "closed", "expired")
_ENDED_SQL = "status IN ('match_over', 'closed', 'expired')"
Kind = Literal["table", "event", "hand", "deadline"]
# Each kind's table, and the order its rows are written and read in.
TABLES: dict[Kind, tuple[str, str]] = {
    "table": ("tables", "table_id"),
    "event": ("events", "seq"),
    "hand": ("hands", "hand"),
    "deadline": ("deadlines", "table_id"),
}


# --- the record: pure ---------------------------------------------------------------------


class Header(msgspec.Struct, frozen=True, kw_only=True):
    """A record's first line."""

    format: str
    version: int
    table_id: str
    archived_at: datetime
    events: int
    hands: int
    deadlines: int


class Line(msgspec.Struct, frozen=True, kw_only=True):
    """Every other line: one row of one kind, its JSON kept as written."""

    kind: Kind
    row: msgspec.Raw


class Rows(msgspec.Struct, frozen=True, kw_only=True):
    """A table's rows, each as the JSON text of ``to_jsonb``."""

    table: str
    events: list[str]
    hands: list[str]
    deadlines: list[str]


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """A record read back."""

    header: Header
    rows: Rows


class BadRecord(ValueError):
    """Bytes that are not a whole record of a format this code reads."""


_json = msgspec.json.Encoder()
_header = msgspec.json.Decoder(Header)
_line = msgspec.json.Decoder(Line)


def encode_record(table_id: str, archived_at: datetime, rows: Rows) -> bytes:
    """A table's record: its lines, gzip-compressed (no time in the gzip header: the same
    rows give the same bytes)."""
    header = Header(
        format=FORMAT,
        version=VERSION,
        table_id=table_id,
        archived_at=archived_at,
        events=len(rows.events),
        hands=len(rows.hands),
        deadlines=len(rows.deadlines),
    )
    lines = [_json.encode(header)]
    kinds: list[tuple[Kind, list[str]]] = [
        ("table", [rows.table]),
        ("event", rows.events),
        ("hand", rows.hands),
        ("deadline", rows.deadlines),
    ]
    for kind, texts in kinds:
        lines += (b'{"kind":"%s","row":%s}' % (kind.encode(), t.encode()) for t in texts)
    return gzip.compress(b"\n".join(lines) + b"\n", mtime=0)


def decode_record(data: bytes) -> Record:
    """A record's header and rows; ``BadRecord`` unless it is whole and of format 1."""
    try:
        first, *rest = gzip.decompress(data).splitlines()
        header = _header.decode(first)
        lines = [_line.decode(text) for text in rest]
    except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
        raise BadRecord(f"not a table archive record: {exc}") from exc
    if header.format != FORMAT or header.version != VERSION:
        raise BadRecord(f"a record of {header.format} {header.version}, not {FORMAT} {VERSION}")
    by_kind: dict[Kind, list[str]] = {"table": [], "event": [], "hand": [], "deadline": []}
    for line in lines:
        by_kind[line.kind].append(bytes(line.row).decode())
    counts = (len(by_kind["table"]), len(by_kind["event"]), len(by_kind["hand"]))
    if counts != (1, header.events, header.hands) or len(by_kind["deadline"]) != header.deadlines:
        raise BadRecord(f"table {header.table_id}: the record is not whole")
    rows = Rows(
        table=by_kind["table"][0],
        events=by_kind["event"],
        hands=by_kind["hand"],
        deadlines=by_kind["deadline"],
    )
    return Record(header=header, rows=rows)


def key_of(table_id: str, last_move_at: datetime) -> str:
    """A table's key in the archive: by the month of its last move, so a lifecycle rule or a
    person can find a season's records by prefix, and a table archived again (after a restore)
    goes to the same key."""
    return f"tables/{last_move_at:%Y}/{last_move_at:%m}/{table_id}.jsonl.gz"


# --- where records go ------------------------------------------------------------------------


class ArchiveStore(Protocol):
    """Where records are written and read back."""

    async def put(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` (replacing what was there)."""

    async def get(self, key: str) -> bytes:
        """The bytes at ``key``; ``FileNotFoundError`` if there are none."""

    def location(self, key: str) -> str:
        """Where ``key`` is, as a URL a person can follow."""

    async def delete(self, key: str) -> None:
        """Delete what is at ``key``, if anything."""


class DirectoryStore:
    """Records as files under a directory (development, tests; a mounted volume)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def put(self, key: str, data: bytes) -> None:
        """Write a file beside the key's, synced, then rename it over: a reader never sees
        half a record."""
        await asyncio.to_thread(self._put, self.root / key, data)

    @staticmethod
    def _put(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    async def get(self, key: str) -> bytes:
        """The file's bytes."""
        return await asyncio.to_thread((self.root / key).read_bytes)

    def location(self, key: str) -> str:
        """``file:///dir/key``."""
        return (self.root / key).absolute().as_uri()

    async def delete(self, key: str) -> None:
        """Remove the file, if there."""
        await asyncio.to_thread((self.root / key).unlink, missing_ok=True)


class BucketStore:
    """Records as objects of an S3 bucket, through obstore (its client is Rust's
    ``object_store``: async, retries with backoff, and configured as the AWS tools are, by
    ``AWS_*`` variables or the pod's identity)."""

    def __init__(self, store: S3Store, bucket: str, prefix: str) -> None:
        self.store = store
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    @classmethod
    def from_url(cls, url: str) -> BucketStore:
        """``s3://bucket/prefix``; the endpoint, region and credentials from the environment
        (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` and
        ``AWS_SECRET_ACCESS_KEY``, or a web identity), as every AWS tool reads them."""
        parts = urlsplit(url)
        prefix = unquote(parts.path).strip("/")
        return cls(S3Store(parts.netloc, prefix=prefix or None), parts.netloc, prefix)

    async def put(self, key: str, data: bytes) -> None:
        """One PUT (a record is far below a multipart's size)."""
        await obstore.put_async(self.store, key, data, use_multipart=False)

    async def get(self, key: str) -> bytes:
        """One GET."""
        result = await obstore.get_async(self.store, key)
        return bytes(await result.bytes_async())

    async def delete(self, key: str) -> None:
        """One DELETE (none there is no error: S3's DELETE is idempotent)."""
        await obstore.delete_async(self.store, key)

    def location(self, key: str) -> str:
        """``s3://bucket/prefix/key``."""
        return f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}{key}"


def store_of(url: str) -> ArchiveStore | None:
    """The store of ``GIN_ARCHIVE_URL`` (None when empty: nothing is archived)."""
    if not url:
        return None
    scheme = urlsplit(url).scheme
    if scheme == "file":
        return DirectoryStore(Path(unquote(urlsplit(url).path)))
    if scheme == "s3":
        return BucketStore.from_url(url)
    raise ValueError(f"GIN_ARCHIVE_URL is file:///dir or s3://bucket/prefix, not {url!r}")


# --- archiving -------------------------------------------------------------------------------


class NotReadBack(RuntimeError):
    """A record read back from the store was not the one written."""


class Read(msgspec.Struct, frozen=True, kw_only=True):
    """A table's rows as of one snapshot, and the row's version then."""

    rows: Rows
    version: int
    last_move_at: datetime


# Tables archived at once: each waits mostly on the store's round trips (a PUT and a GET), so a
# few at once keep a run short; few enough to take a small share of the pool.
WRITERS = 4

_DUE = (
    f"SELECT table_id FROM tables WHERE {_ENDED_SQL} AND created_at < $1 AND last_move_at < $1"
    " ORDER BY created_at LIMIT $2"
)

_ROWS = """
SELECT t.version, t.last_move_at, to_jsonb(t)::text AS table_row,
    ARRAY(SELECT to_jsonb(e)::text FROM events e WHERE e.table_id = $1 ORDER BY e.seq) AS events,
    ARRAY(SELECT to_jsonb(h)::text FROM hands h WHERE h.table_id = $1 ORDER BY h.hand) AS hands,
    ARRAY(SELECT to_jsonb(d)::text FROM deadlines d WHERE d.table_id = $1) AS deadlines
FROM tables t WHERE t.table_id = $1
"""

# Every row of the table in one statement, and its tombstone. Events by table_id alone: the
# log's key and partitioning are not this statement's business.
_FORGET = """
WITH e AS (DELETE FROM events WHERE table_id = $1),
    h AS (DELETE FROM hands WHERE table_id = $1),
    c AS (DELETE FROM commands WHERE table_id = $1),
    d AS (DELETE FROM deadlines WHERE table_id = $1),
    t AS (DELETE FROM tables WHERE table_id = $1 RETURNING creator_id, seats)
INSERT INTO archived (table_id, key, location, sha256, archived_at, players)
SELECT $1, $2, $3, $4, $5, array_remove(ARRAY[t.creator_id, t.seats #>> '{1,id}'], NULL)
FROM t
"""


async def read_rows(conn: Conn, table_id: str) -> Read | None:
    """A table's rows in one statement (one snapshot); None if it has none."""
    record = await conn.fetchrow(_ROWS, table_id)
    if record is None:
        return None
    rows = Rows(
        table=record["table_row"],
        events=list(record["events"]),
        hands=list(record["hands"]),
        deadlines=list(record["deadlines"]),
    )
    return Read(rows=rows, version=record["version"], last_move_at=record["last_move_at"])


async def archive_due(
    pool: asyncpg.Pool, store: ArchiveStore, now: datetime, after_s: float, batch: int
) -> int:
    """Archive up to ``batch`` ended tables whose last move is older than ``after_s`` seconds
    at ``now`` (the app's clock), oldest first; how many were. A store that fails raises,
    with nothing of that table deleted."""
    cutoff = now - timedelta(seconds=after_s)
    async with pool.acquire() as conn:
        due = [r[0] for r in await conn.fetch(_DUE, cutoff, batch)]
    writers = asyncio.Semaphore(WRITERS)

    async def one(table_id: str) -> str | None:
        async with writers:
            return await archive_table(pool, store, table_id, now, cutoff)

    results = await asyncio.gather(*(one(t) for t in due), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return sum(result is not None for result in results)


def archive_step(
    pool: asyncpg.Pool, settings: Settings
) -> Callable[[Conn, datetime], Awaitable[int]] | None:
    """The maintenance step of ``GIN_ARCHIVE_URL`` (None when it is empty): each run archives
    up to ``maintenance_batch`` tables ended ``archive_after_s`` ago by the run's clock, on
    connections of ``pool`` (not the run's: tables go ``WRITERS`` at once)."""
    store = store_of(settings.archive_url)
    if store is None:
        return None
    after_s, batch = settings.archive_after_s, settings.maintenance_batch

    async def step(conn: Conn, now: datetime) -> int:
        return await archive_due(pool, store, now, after_s, batch)

    return step


async def archive_table(
    pool: asyncpg.Pool, store: ArchiveStore, table_id: str, now: datetime, cutoff: datetime
) -> str | None:
    """Archive one table if it is ended with its last move before ``cutoff``: write its
    record, read it back, then delete its rows and leave its tombstone. Where the record is,
    or None if the table was not archived (gone, moved meanwhile, or locked by a move)."""
    async with pool.acquire() as conn:
        read = await read_rows(conn, table_id)
    if read is None:
        return None
    data = encode_record(table_id, now, read.rows)
    key = key_of(table_id, read.last_move_at)
    await store.put(key, data)
    digest = hashlib.sha256(data).hexdigest()
    if hashlib.sha256(await store.get(key)).hexdigest() != digest:
        raise NotReadBack(f"table {table_id}: {store.location(key)} is not what was written")
    location = store.location(key)
    async with pool.acquire() as conn, conn.transaction():
        version = await conn.fetchval(
            f"SELECT version FROM tables WHERE table_id = $1 AND {_ENDED_SQL}"
            " AND last_move_at < $2 FOR UPDATE SKIP LOCKED",
            table_id,
            cutoff,
        )
        if version != read.version:  # locked by a move, or moved since the record was read
            log.info("table_not_archived", table_id=table_id, reason="moved_or_locked")
            return None
        await conn.execute(_FORGET, table_id, key, location, digest, now)
    log.info("table_archived", table_id=table_id, location=location, bytes=len(data))
    return location


# --- archived tables' routes -------------------------------------------------------------------


async def archived_location(conn: Conn, table_id: str) -> str | None:
    """Where an archived table's record is; None if the table is not archived."""
    value: str | None = await conn.fetchval(
        "SELECT location FROM archived WHERE table_id = $1", table_id
    )
    return value


def gone(location: str) -> Refused:
    """The refusal of an archived table's routes: 410 ``archived``, naming its record."""
    return Refused(
        410,
        "archived",
        f"this table ended long ago and was archived to {location}; it can be restored",
    )


async def refuse_if_archived(conn: Conn, table_id: str) -> None:
    """Raise ``gone`` if the table is archived (for a route that found no table)."""
    location = await archived_location(conn, table_id)
    if location is not None:
        raise gone(location)


# --- restore -------------------------------------------------------------------------------------


class NotArchived(LookupError):
    """A restore of a table that has no tombstone."""


async def restore(pool: asyncpg.Pool, store: ArchiveStore, table_id: str) -> Header:
    """Read an archived table's record back and write its rows again, removing its tombstone,
    in one transaction: the table is served again as it was. Its record's header."""
    async with pool.acquire() as conn:
        key = await conn.fetchval("SELECT key FROM archived WHERE table_id = $1", table_id)
    if key is None:
        raise NotArchived(f"table {table_id} is not archived")
    record = decode_record(await store.get(key))
    if record.header.table_id != table_id:
        raise BadRecord(f"{store.location(key)} is the record of {record.header.table_id}")
    async with pool.acquire() as conn, conn.transaction():
        locked = await conn.fetchval(
            "SELECT key FROM archived WHERE table_id = $1 FOR UPDATE", table_id
        )
        if locked is None:
            raise NotArchived(f"table {table_id} was restored meanwhile")
        rows = record.rows
        await _insert(conn, "tables", [rows.table])
        await _insert(conn, "events", rows.events)
        await _insert(conn, "hands", rows.hands)
        await _insert(conn, "deadlines", rows.deadlines)
        await conn.execute("DELETE FROM archived WHERE table_id = $1", table_id)
    log.info("table_restored", table_id=table_id, location=store.location(key))
    return record.header


async def restore_for_erasure(pool: asyncpg.Pool, store: ArchiveStore, subject: str) -> list[str]:
    """Restore every archived table ``subject`` sat at, so that an erasure reaches their rows;
    the keys of their records, which still name the person: the caller deletes them once the
    erasure has committed (a re-archived table is written again, under its new last move)."""
    async with pool.acquire() as conn:
        found = await conn.fetch(
            "SELECT table_id, key FROM archived WHERE players @> ARRAY[$1::text] ORDER BY 1",
            subject,
        )
    keys = []
    for table_id, key in found:
        with contextlib.suppress(NotArchived):  # restored meanwhile: erased with the others
            await restore(pool, store, table_id)
        keys.append(key)
    return keys


async def _insert(conn: Conn, table: str, rows: Sequence[str]) -> None:
    """Insert rows given as ``to_jsonb`` text by their column names: the columns the table has
    now and the rows name (one added since the record was written takes its default)."""
    if not rows:
        return
    columns = await conn.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass"
        " AND attnum > 0 AND NOT attisdropped AND attgenerated = ''",
        table,
    )
    named = set(msgspec.json.decode(rows[0].encode(), type=dict[str, msgspec.Raw]))
    names = ", ".join(f'"{c[0]}"' for c in columns if c[0] in named)
    await conn.execute(
        f"INSERT INTO {table} ({names}) SELECT {names}"
        f" FROM jsonb_populate_recordset(NULL::{table}, $1::jsonb)",
        "[" + ",".join(rows) + "]",
    )


# --- the command -------------------------------------------------------------------------------


async def _restore_command(settings: Settings, table_id: str) -> int:
    store = store_of(settings.archive_url)
    if store is None:
        print("GIN_ARCHIVE_URL is empty: there is no archive to restore from", file=sys.stderr)
        return 2
    pool = await create_pool(settings.database_url, "gin_table", 2)
    try:
        header = await restore(pool, store, table_id)
    except (NotArchived, BadRecord, FileNotFoundError) as exc:
        print(f"not restored: {exc}", file=sys.stderr)
        return 1
    finally:
        await pool.close()
    print(
        f"table {table_id} restored: {header.events} events, {header.hands} hands"
        f" (archived at {header.archived_at.isoformat()})"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m services.table.archive restore TABLE_ID``, with the service's settings."""
    parser = argparse.ArgumentParser(prog="python -m services.table.archive")
    commands = parser.add_subparsers(dest="command", required=True)
    restoring = commands.add_parser("restore", help="serve an archived table again")
    restoring.add_argument("table_id", help="the table's id, as in its address")
    args = parser.parse_args(_id_not_an_option(sys.argv[1:] if argv is None else argv))
    if TABLE_ID.search(args.table_id) is None:
        parser.error(f"{args.table_id!r} is not a table id (1 to 64 of A-Z a-z 0-9 _ -)")
    return asyncio.run(_restore_command(Settings.from_env(), args.table_id))


def _id_not_an_option(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--`` before the table id: an id is URL-safe base64, so one in 64 begins
    with ``-``, and argparse would take such an id for an option."""
    args = list(argv)
    if len(args) == 2 and args[0] == "restore" and args[1] not in ("-h", "--help"):
        args.insert(1, "--")
    return args


if __name__ == "__main__":
    sys.exit(main())
