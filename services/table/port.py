"""The table store as a port: what ``Tables`` needs of storage, with two implementations.

``PgStore`` is the production one: the functions of ``store`` on one PostgreSQL connection,
inside the caller's transaction. ``InMemoryStore`` is its twin in a process's memory, for
rules that need no database (tests) and as the executable description of the contract. One
contract suite (tests/table/test_store_contract.py, after eventsourcing's recorder tests)
runs against both, so the twin cannot drift from what PostgreSQL does.
"""

from __future__ import annotations

import copy
from typing import Protocol

import msgspec

from services.table import store
from services.table.store import Attempt, Change, Locked, Seating, TableRow
from shared.infra.db import Conn

_json = msgspec.json.Encoder()


class TableStore(Protocol):
    """Tables, their events and command results, and players' deck designs."""

    async def insert_table(self, row: TableRow) -> None:
        """Store a new table (version 0)."""

    async def lock_for_command(
        self,
        table_id: str,
        command_id: str | None = None,
        player: str | None = None,
        actor: str | None = None,
    ) -> Locked | None:
        """The table as committed (locked until the transaction ends), the stored result of
        this actor's ``command_id`` and the player's deck design; None: no such table."""

    async def save_change(self, change: Change) -> None:
        """Store a change of a table loaded by ``lock_for_command`` (its row's version one
        below the change's)."""

    async def save_if_current(self, attempts: list[Attempt]) -> set[str]:
        """Store each attempt whose table is still at its version, its mover's design as it
        was and its command id unused by its actor; the table ids stored."""

    async def read_seating(self, table_id: str) -> Seating | None:
        """Who sits at the table, and its invitation, as committed."""

    async def read_table(self, table_id: str) -> TableRow | None:
        """The table as committed, without a lock."""

    async def deck_design(self, player: str) -> str | None:
        """A player's deck design, if chosen."""

    async def set_deck_design(self, player: str, design: str) -> None:
        """Choose a player's deck design."""

    async def events_after(self, table_id: str, after: int, limit: int) -> list[str]:
        """The table's event envelopes as JSON with seq above ``after``, in order."""


class PgStore:
    """The table store on one PostgreSQL connection (in the caller's transaction)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    async def insert_table(self, row: TableRow) -> None:
        await store.insert_table(self.conn, row)

    async def lock_for_command(
        self,
        table_id: str,
        command_id: str | None = None,
        player: str | None = None,
        actor: str | None = None,
    ) -> Locked | None:
        return await store.lock_for_command(self.conn, table_id, command_id, player, actor)

    async def save_change(self, change: Change) -> None:
        await store.save_change(self.conn, change)

    async def save_if_current(self, attempts: list[Attempt]) -> set[str]:
        return await store.save_if_current(self.conn, attempts)

    async def read_seating(self, table_id: str) -> Seating | None:
        return await store.read_seating(self.conn, table_id)

    async def read_table(self, table_id: str) -> TableRow | None:
        return await store.read_table(self.conn, table_id)

    async def deck_design(self, player: str) -> str | None:
        return await store.deck_design(self.conn, player)

    async def set_deck_design(self, player: str, design: str) -> None:
        await store.set_deck_design(self.conn, player, design)

    async def events_after(self, table_id: str, after: int, limit: int) -> list[str]:
        return await store.events_after(self.conn, table_id, after, limit)


class InMemoryStore:
    """The table store in memory: the same answers as ``PgStore`` (no locks: one task)."""

    def __init__(self) -> None:
        self.tables: dict[str, TableRow] = {}
        self.events: dict[str, dict[int, str]] = {}
        self.results: dict[tuple[str, str, str], str] = {}  # (table, actor, command id)
        self.designs: dict[str, str] = {}
        self.hands: dict[tuple[str, int], bytes] = {}
        self.outbox: list[store.OutboxRow] = []

    async def insert_table(self, row: TableRow) -> None:
        if row.table_id in self.tables:
            raise KeyError(f"table {row.table_id!r} exists")
        self.tables[row.table_id] = copy.deepcopy(row)
        self.events[row.table_id] = {}

    async def lock_for_command(
        self,
        table_id: str,
        command_id: str | None = None,
        player: str | None = None,
        actor: str | None = None,
    ) -> Locked | None:
        row = await self.read_table(table_id)
        if row is None:
            return None
        prior = None
        if command_id is not None and actor is not None:
            prior = self.results.get((table_id, actor, command_id))
        design = None if player is None else self.designs.get(player)
        return Locked(row=row, prior=prior, deck_design=design)

    async def save_change(self, change: Change) -> None:
        attempt = Attempt(change=change, version=change.row.version - 1, player=None, design=None)
        if not await self.save_if_current([attempt]):
            raise RuntimeError(f"table {change.row.table_id!r} moved on under its lock")

    async def save_if_current(self, attempts: list[Attempt]) -> set[str]:
        saved = set()
        for attempt in attempts:
            if self._current(attempt):
                self._save(attempt.change)
                saved.add(attempt.change.row.table_id)
        return saved

    def _current(self, attempt: Attempt) -> bool:
        change = attempt.change
        table_id = change.row.table_id
        stored = self.tables.get(table_id)
        if stored is None or stored.version != attempt.version:
            return False
        if attempt.player is not None and self.designs.get(attempt.player) != attempt.design:
            return False
        key = (table_id, change.actor or "", change.command_id or "")
        return change.command_id is None or key not in self.results

    def _save(self, change: Change) -> None:
        row = change.row
        self.tables[row.table_id] = copy.deepcopy(row)
        log = self.events[row.table_id]
        for envelope, body in zip(change.envelopes, change.encoded, strict=True):
            log[envelope.seq] = body.decode()
        self.outbox += change.outbox
        for hand, record in change.hands:
            self.hands[(row.table_id, hand)] = record
        if change.command_id is not None and change.result is not None:
            key = (row.table_id, change.actor or "", change.command_id)
            self.results[key] = change.result.decode()

    async def read_seating(self, table_id: str) -> Seating | None:
        row = self.tables.get(table_id)
        return None if row is None else store.seating_of(row.invite_code, row.creator_id, row.seats)

    async def read_table(self, table_id: str) -> TableRow | None:
        row = self.tables.get(table_id)
        return None if row is None else copy.deepcopy(row)

    async def deck_design(self, player: str) -> str | None:
        return self.designs.get(player)

    async def set_deck_design(self, player: str, design: str) -> None:
        self.designs[player] = design

    async def events_after(self, table_id: str, after: int, limit: int) -> list[str]:
        log = self.events.get(table_id, {})
        return [log[seq] for seq in sorted(s for s in log if s > after)[:limit]]
