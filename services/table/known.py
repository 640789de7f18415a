"""What this replica knows of the tables its sockets watch, to serve a new socket at once.

Of each watched table the hub keeps the newest row this replica has (its own commits, its
reads) and the newest seq it has heard of (also other replicas' batches). A new socket's
snapshot comes from that row, not the database, while no newer seq was heard; and a
spectator's snapshot frame is encoded once per version and deck design. A table is
forgotten when its last socket leaves.
"""

from __future__ import annotations

from collections.abc import Container

import msgspec

from services.table.store import TableRow
from services.table.tables import Tables
from shared.contracts.api import WsSnapshot

_json = msgspec.json.Encoder()


class Known:
    """The newest row and seq of each watched table, and spectators' snapshot frames."""

    def __init__(self, tables: Tables, watched: Container[str]) -> None:
        self.tables = tables
        self.watched = watched  # the tables some socket here watches (the hub's)
        self.latest: dict[str, TableRow] = {}
        self.heard: dict[str, int] = {}
        self.snapshots: dict[tuple[str, str | None], tuple[int, bytes]] = {}

    def remember(self, row: TableRow) -> None:
        """A table's row as committed (read or written here), kept while it is watched and
        no newer seq has been heard of."""
        table_id = row.table_id
        if table_id in self.watched and row.seq >= self.heard.get(table_id, 0):
            self.latest[table_id] = row
            self.heard[table_id] = row.seq

    def hear(self, table_id: str, seq: int) -> None:
        """A table event exists up to ``seq``: a row older than that is no longer current."""
        if seq > self.heard.get(table_id, 0) and table_id in self.watched:
            self.heard[table_id] = seq
            row = self.latest.get(table_id)
            if row is not None and row.seq < seq:
                del self.latest[table_id]

    def current(self, table_id: str) -> TableRow | None:
        """The newest row of a watched table, if this replica has it."""
        return self.latest.get(table_id)

    def snapshot_frame(self, row: TableRow, seat: int | None, design: str | None) -> bytes:
        """A ``WsSnapshot`` of the row for this viewer; a spectator's is encoded once per
        version and deck design (views of a seat carry legal moves of the moment)."""
        if seat is not None:
            return _json.encode(WsSnapshot(view=self.tables.table_view(row, seat, design)))
        key = (row.table_id, design)
        kept = self.snapshots.get(key)
        if kept is not None and kept[0] == row.version:
            return kept[1]
        frame = _json.encode(WsSnapshot(view=self.tables.table_view(row, None, design)))
        if row.table_id in self.watched:
            self.snapshots[key] = (row.version, frame)
        return frame

    def forget(self, table_id: str) -> None:
        """Its last socket left: nothing of the table is kept."""
        self.latest.pop(table_id, None)
        self.heard.pop(table_id, None)
        for key in [k for k in self.snapshots if k[0] == table_id]:
            del self.snapshots[key]
