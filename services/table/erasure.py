"""Erasure of a person's data on request (LGPD art. 18, issue 32): the person's own
``DELETE /v1/players/me`` and the operator's ``python -m services.table.erasure <subject>``.

One transaction in the table service's schema (``erase``):

1. The tables the person sits at (or created) are locked, in table-id order.
2. At each one still open the person leaves, as their ``leave`` command would: a waiting
   table closes, a match on ends (the opponent wins, reason ``left``), then the rematch is
   declined. A seat held by nobody cannot go on being played, and the opponent is not left
   waiting out the absence rule for someone who is gone.
3. The person's seat at each of those tables becomes one pseudonym (``Jogador removido``, an
   ``erased-<random>`` id drawn once per erasure and kept nowhere with the subject); the
   table's version and seq move on by one, with a ``player_erased`` event that names the seat
   and the pseudonym, never the person (the log, the broker's history and every subscriber
   get it; a subscriber knows whom the seat held from its own copy of ``seat_taken``).
4. Every copy of the person (a ``Player`` with their id: seats, ``table_created`` and
   ``seat_taken`` events, the answers kept for others' command ids, bot turns and events in
   the outbox not yet published, hand records) is replaced by the pseudonym; the person's own
   command ids (whose answers are theirs), deck design and rate-limit counts are deleted.
   What remains, and for how long (the published outbox rows, a day; the broker's history
   stream, a week; backups; the archive): deploy/README.md, "Erasure".

Games stay whole: no event, hand record or table is deleted, and every seq keeps its event.
Idempotent: once erased, the subject is nowhere in the schema, so a second erasure finds
nothing and changes nothing. The token still works: its holder is someone with no seat.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from typing import Any

import asyncpg
import msgspec
import structlog

from services.table import archive, store
from services.table.decide import Actor
from services.table.port import PgStore
from services.table.store import Change
from services.table.tables import Tables
from shared.contracts import commands as c
from shared.contracts.envelope import wrap
from shared.contracts.events import Player, PlayerErased
from shared.infra import ratelimit
from shared.infra.auth import Identity
from shared.infra.db import Conn, create_pool
from shared.infra.outbox import NOTIFY_CHANNEL
from shared.infra.settings import Settings
from shared.infra.web import Refused

log = structlog.get_logger()
ERASED_NAME = "Jogador removido"
OPEN = ("waiting", "playing", "match_over")
# A match on ends with the first leave (match over), the rematch is declined with the second.
MOST_LEAVES = 2
# A deadlock with a move's statement (which locks tables in its own order) aborts the erasure's
# transaction: it is tried again from the start, this many times at most.
ATTEMPTS = 3
# Any JSON object of a document whose ``id`` is the subject.
_HOLDS = "$.** ? (@.id == $sub)"
_json = msgspec.json.Encoder()


class Erased(msgspec.Struct, kw_only=True):
    """What one erasure changed: each table's change (its leaves and ``player_erased``), to
    hand to the relay and the sockets once committed."""

    changes: list[Change]


def pseudonym() -> Player:
    """A seat's new occupant: random, so it links to nobody (one per erasure)."""
    return Player(id=f"erased-{secrets.token_hex(12)}", name=ERASED_NAME)


def scrubbed(value: Any, subject: str, pseudo: Player) -> tuple[Any, bool]:
    """A JSON value with every object whose ``id`` is ``subject`` (a ``Player``: a seat, a
    creator, an event's player) made the pseudonym's, and whether anything changed.

    >>> scrubbed({"seats": [{"id": "s1", "name": "Ana"}, None]}, "s1", Player(id="e", name="X"))
    ({'seats': [{'id': 'e', 'name': 'X'}, None]}, True)
    """
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for key, item in value.items():
            out[key], changed_here = scrubbed(item, subject, pseudo)
            changed = changed or changed_here
        if out.get("id") == subject:
            out["id"], out["name"] = pseudo.id, pseudo.name
            changed = True
        return out, changed
    if isinstance(value, list):
        items = [scrubbed(item, subject, pseudo) for item in value]
        return [item for item, _ in items], any(changed for _, changed in items)
    return value, False


def _scrub_text(text: str | bytes, subject: str, pseudo: Player) -> bytes | None:
    """A JSON document with the subject replaced (``scrubbed``), or None if it had none."""
    value, changed = scrubbed(msgspec.json.decode(text), subject, pseudo)
    return _json.encode(value) if changed else None


async def erase(conn: Conn, tables: Tables, identity: Identity) -> Erased:
    """Erase ``identity``'s data from the table service's schema, in the caller's
    transaction (module docstring). Each statement reads one table's rows, or rows found by
    an index, so each stays within the statement timeout however many tables the service
    keeps; only ``rate_limits`` (the current windows' counts, no more) is read whole."""
    subject = identity.id
    pseudo = pseudonym()
    table_ids: list[str] = [
        r[0]
        for r in await conn.fetch(
            # Seat 0 is the creator's, seat 1 the joiner's (migration 012's indexes).
            "SELECT table_id FROM tables WHERE creator_id = $1 OR (seats #>> '{1,id}') = $1"
            " ORDER BY table_id FOR UPDATE",
            subject,
        )
    ]
    changes = []
    for table_id in table_ids:
        changes.append(await _erase_at(conn, tables, identity, table_id, pseudo))
        await _scrub_table(conn, table_id, subject, pseudo)
    await _scrub_outbox(conn, subject, pseudo)
    await conn.execute("DELETE FROM preferences WHERE player_id = $1", subject)
    await conn.execute(
        "DELETE FROM rate_limits WHERE identity = ANY($1::text[])",
        list({subject, ratelimit._key(subject)}),
    )
    return Erased(changes=[change for change in changes if change is not None])


async def _erase_at(
    conn: Conn, tables: Tables, identity: Identity, table_id: str, pseudo: Player
) -> Change | None:
    """The person leaves the table (if open) and their seat becomes ``pseudo``, with a
    ``player_erased`` event; the change of both (None: not seated there)."""
    actor = Actor(kind="person", identity=identity)
    db = PgStore(conn)
    done: list[Change] = []
    for _ in range(MOST_LEAVES):
        row = await store.read_table(conn, table_id)  # locked by this transaction
        if row is None or row.status not in OPEN or row.seat_of(identity.id) is None:
            break
        _, change = await tables.command(db, table_id, actor, c.Leave())
        if change is not None:
            done.append(change)
    row = await store.read_table(conn, table_id)
    seat = None if row is None else row.seat_of(identity.id)
    if row is None or seat is None:
        return None
    seats = [pseudo if i == seat else player for i, player in enumerate(row.seats)]
    after = msgspec.structs.replace(row, seats=seats, version=row.version + 1, seq=row.seq + 1)
    event = PlayerErased(seat=seat, player=pseudo)
    envelope = wrap(table_id, after.seq, event, tables.now(), after.version)
    encoded, outbox, _ = store.change_of(table_id, [envelope], [], None)
    erased = Change(row=after, envelopes=[envelope], encoded=encoded, outbox=outbox)
    await store.save_change(conn, erased)
    # What the sockets and the relay are handed: every event of the erasure at this table,
    # with the row as it is now (the leaves' own rows and views still have the person's name).
    return Change(
        row=after,
        envelopes=[e for change in [*done, erased] for e in change.envelopes],
        encoded=[e for change in [*done, erased] for e in change.encoded],
        outbox=[m for change in [*done, erased] for m in change.outbox],
    )


async def _scrub_table(conn: Conn, table_id: str, subject: str, pseudo: Player) -> None:
    """One table's rows that carry the person, found by their table (an index), then by a
    JSON path; updated by their keys. The events by table and seq only: no key of the events
    table is assumed (it is partitioned, with a key of its own)."""
    await conn.execute(
        "UPDATE tables SET creator_id = $2 WHERE table_id = $1 AND creator_id = $3",
        table_id,
        pseudo.id,
        subject,
    )
    sub = _json.encode({"sub": subject}).decode()
    for rows, update in (
        (
            "SELECT seq, envelope::text FROM events WHERE table_id = $1"
            f" AND jsonb_path_exists(envelope, '{_HOLDS}', $2::jsonb)",
            "UPDATE events SET envelope = $3::jsonb WHERE table_id = $1 AND seq = $2",
        ),
        (  # none today: a hand's record names seats, not people
            "SELECT hand, record::text FROM hands WHERE table_id = $1"
            f" AND jsonb_path_exists(record, '{_HOLDS}', $2::jsonb)",
            "UPDATE hands SET record = $3::jsonb WHERE table_id = $1 AND hand = $2",
        ),
    ):
        for key, text in await conn.fetch(rows, table_id, sub):
            body = _scrub_text(text, subject, pseudo)
            if body is not None:
                await conn.execute(update, table_id, key, body.decode())
    await _scrub_commands(conn, table_id, subject, sub, pseudo)


async def _scrub_commands(
    conn: Conn, table_id: str, subject: str, sub: str, pseudo: Player
) -> None:
    """The person's own command ids are deleted (their answers are theirs, and an id of
    theirs is never sent again by anyone); the answers kept for the others' command ids show
    the pseudonym (their views and events carry the seats)."""
    person = Actor(kind="person", identity=Identity(subject, "")).label
    await conn.execute("DELETE FROM commands WHERE table_id = $1 AND actor = $2", table_id, person)
    rows = await conn.fetch(
        "SELECT actor, command_id, result FROM commands WHERE table_id = $1"
        f" AND jsonb_path_exists(result::jsonb, '{_HOLDS}', $2::jsonb)",
        table_id,
        sub,
    )
    for actor, command_id, result in rows:
        body = _scrub_text(result, subject, pseudo)
        if body is not None:
            await conn.execute(
                "UPDATE commands SET result = $4"
                " WHERE table_id = $1 AND actor = $2 AND command_id = $3",
                table_id,
                actor,
                command_id,
                body.decode(),
            )


async def _scrub_outbox(conn: Conn, subject: str, pseudo: Player) -> None:
    """Outbox rows not published yet whose body carries the person (events, and bot turns,
    whose view has the seats) go out with the pseudonym (found by the outbox's index of
    unpublished rows). Those published already are what the broker and its history stream
    hold: they are deleted with the outbox's retention (a day). Reading every published row
    for them would read the whole day's outbox, far past any statement timeout."""
    needle = _json.encode(subject)[1:-1]  # the subject as it appears inside a JSON string
    rows = await conn.fetch(
        "SELECT id, body FROM outbox WHERE published_at IS NULL"
        " AND position($1::bytea IN body) > 0",
        needle,
    )
    for row_id, body in rows:
        new = _scrub_text(body, subject, pseudo)
        if new is not None:
            await conn.execute("UPDATE outbox SET body = $2 WHERE id = $1", row_id, new)


def forget(tables: Tables, subject: str, erased: Erased) -> None:
    """After the commit: this replica forgets the person's seatings and deck design (its
    committed rows are replaced by the erasure's, through the changes)."""
    for change in erased.changes:
        tables.memory.seatings.pop(change.row.table_id, None)
    tables.memory.designs.pop(subject, None)


async def erase_in_transaction(pool: asyncpg.Pool, tables: Tables, identity: Identity) -> Erased:
    """``erase`` in a transaction of its own, tried again after a deadlock."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            async with pool.acquire() as conn, conn.transaction():
                return await erase(conn, tables, identity)
        except asyncpg.DeadlockDetectedError:
            if attempt == ATTEMPTS:
                raise
            log.info("erasure_deadlock_retried", attempt=attempt)
    raise AssertionError("unreachable")


async def erase_everywhere(
    pool: asyncpg.Pool, tables: Tables, identity: Identity, archive_url: str
) -> Erased:
    """``erase_in_transaction``, reaching the archive too: the archived tables the person sat
    at are restored first (so their rows are erased as any other's), and once the erasure
    has committed their old records, which still name the person, are deleted from the
    archive. An archive that cannot be read answers 503 with nothing erased; a record that
    cannot be deleted afterwards is logged by its key (never the subject) for an operator."""
    archived = archive.store_of(archive_url)
    keys: list[str] = []
    if archived is not None:
        try:
            keys = await archive.restore_for_erasure(pool, archived, identity.id)
        except Exception as exc:
            log.warning("erasure_archive_unavailable", error=repr(exc))
            raise Refused(
                503,
                "archive_unavailable",
                "the archive of ended tables cannot be read now, so nothing was erased:"
                " try again in a while",
                headers={"Retry-After": "60"},
            ) from exc
    erased = await erase_in_transaction(pool, tables, identity)
    for key in keys:
        assert archived is not None
        try:
            await archived.delete(key)
        except Exception as exc:
            log.error("erasure_archive_record_left", key=key, error=repr(exc))
    return erased


async def erase_subject(settings: Settings, subject: str) -> int:
    """The operator's erasure of one subject (``python -m services.table.erasure``): the
    same transaction, then one NOTIFY that wakes the table's relays. The number of tables."""
    from services.table.app import SCHEMA  # the app module opens nothing at import

    pool = await create_pool(settings.database_url, SCHEMA, 2)
    try:
        tables = Tables(settings.public_url, settings.absence_after_s, settings.expiry_after_s)
        erased = await erase_everywhere(pool, tables, Identity(subject, ""), settings.archive_url)
        async with pool.acquire() as conn:
            await conn.execute("SELECT pg_notify($1, '')", NOTIFY_CHANNEL)
    finally:
        await pool.close()
    return len(erased.changes)


def main(argv: list[str]) -> int:
    """``python -m services.table.erasure <subject>``: erase one person by the token subject
    the site knows them by (GIN_DATABASE_URL as the service's)."""
    if len(argv) != 1 or not argv[0]:
        print("usage: python -m services.table.erasure <subject>", file=sys.stderr)
        return 2
    try:
        count = asyncio.run(erase_subject(Settings.from_env(), argv[0]))
    except Refused as exc:  # the archive could not be read: nothing erased
        print(f"not erased: {exc.message}", file=sys.stderr)
        return 1
    print(f"erased: the subject's seats at {count} table(s) are pseudonymous now")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
