"""What a table replica remembers between commands, so that most need no read.

- Full seatings (``store.Seating``): seats are only ever filled (R10.1), so a full seating
  once committed is true for good; a spectator's command is refused from it with no
  connection, and the WebSocket route knows the table exists.
- Committed rows: a person's next command at a table whose last commit was this replica's is
  decided on that row and saved in one statement if the table is still at its version
  (``Tables.command_at_once``).
- Deck designs by person, as last read: the one-statement save checks them.

Each is a least-recently-used cache (``cachetools.LRUCache``) of a bounded number of entries.
"""

from __future__ import annotations

from cachetools import LRUCache

from services.table.store import Seating, TableRow, seating_of

SEATINGS_KEPT = 100_000  # full seatings remembered per replica
ROWS_KEPT = 20_000  # committed rows (and deck designs) remembered per replica


class TableMemory:
    """The replica's seatings, committed rows and deck designs."""

    def __init__(self, rows_kept: int = ROWS_KEPT, seatings_kept: int = SEATINGS_KEPT) -> None:
        self.seatings: LRUCache[str, Seating] = LRUCache(seatings_kept)
        self.rows: LRUCache[str, TableRow] | None = LRUCache(rows_kept) if rows_kept > 0 else None
        self.designs: LRUCache[str, str | None] = LRUCache(max(rows_kept, 1))

    def seating(self, table_id: str) -> Seating | None:
        """A full seating, if remembered."""
        return self.seatings.get(table_id)

    def keep_seating(self, table_id: str, seating: Seating) -> None:
        """Remember a committed seating, once full."""
        if seating.full:
            self.seatings[table_id] = seating

    def seating_of_row(self, row: TableRow) -> Seating:
        """The seating of a row read under its lock (so committed), remembered once full."""
        known = self.seatings.get(row.table_id)
        if known is not None:  # full, so the row's seating is this one (R10.1)
            return known
        seating = seating_of(row.invite_code, row.creator_id, row.seats)
        self.keep_seating(row.table_id, seating)
        return seating

    def committed(self, row: TableRow) -> None:
        """A row as just committed (never one read or changed inside an open transaction)."""
        if self.rows is not None:
            self.rows[row.table_id] = row

    def row(self, table_id: str) -> TableRow | None:
        """The table's row as this replica last committed it, if remembered."""
        return None if self.rows is None else self.rows.get(table_id)

    def forget_row(self, table_id: str) -> None:
        """A remembered row found stale (a commit elsewhere since)."""
        if self.rows is not None:
            self.rows.pop(table_id, None)

    def keep_design(self, player: str, design: str | None) -> None:
        """A person's deck design as just read."""
        self.designs[player] = design

    def design(self, player: str) -> tuple[bool, str | None]:
        """Whether the person's design is remembered, and the design."""
        if player not in self.designs:
            return False, None
        return True, self.designs[player]
