"""The player socket, ``GET /v1/players/me/ws``: a person's lobby, without polling.

First the first page of the caller's open tables (``PlayerTables``), then, each time one of
them changes turn or status (or a new one becomes theirs: they created it, or took its seat),
its entry (``PlayerTable``). Every table event reaches every replica in the relay's batches
(``feed.py``): the hub hands each event's table and type here (``Lobby.heard``), so any
replica serves any player. The entry is read again from the database by its indexes
(``listing.Lister.one``), one read a changed table for the players watching it here, off the
feed's path, and sent only when its turn or status differ from what the socket was sent.

Admission, queues, writers and closes are the table socket's (``sockets.py``, ``clients.py``):
the same 1013 when the replica is full (a player socket counts towards ``GIN_MAX_SOCKETS``),
4008 when too slow, 4001 when the token expires, 1001 at shutdown; the ``sockets`` rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

import asyncpg
import msgspec
import structlog
from aiohttp import web

from services.table.clients import Client
from services.table.deadlines import OPEN
from services.table.hub import Hub
from services.table.listing import Lister, open_table_ids
from shared.contracts.api import LIST_LIMIT, MyTable, PlayerTable, PlayerTables
from shared.contracts.events import Player
from shared.contracts.views import TableStatus
from shared.infra.auth import Identity

log = structlog.get_logger()
_json = msgspec.json.Encoder()
# A player socket's ``table_id`` in the hub's terms: it watches no one table.
LOBBY = ""
# The events that may seat someone at a table no player socket here watched yet.
SEATING = frozenset({"table_created", "seat_taken"})
# Pages sent again (``resync``) between two reads of the tables changed meanwhile: a replica's
# thousands of player sockets do not hold up the live changes for the whole of their pages.
RELIST_BATCH = 50
# A table that changes turn or status: what a socket was last sent of it.
Turn = tuple[TableStatus, int | None, datetime | None, tuple[str | None, ...]]


class _Seated(msgspec.Struct):
    creator: Player | None = None
    player: Player | None = None


class _SeatingEvent(msgspec.Struct):
    data: _Seated


_seating_decoder = msgspec.json.Decoder(_SeatingEvent)


def turn_of(entry: MyTable) -> Turn:
    """What a frame is sent for: the status, who is to act since when, and who sits."""
    names = tuple(None if seat is None else seat.name for seat in entry.seats)
    return entry.status, entry.to_act, entry.turn_since, names


class Lobby:
    """This replica's player sockets, by player, and the tables each watches."""

    def __init__(self, pool: asyncpg.Pool, lister: Lister, hub: Hub) -> None:
        self.pool = pool
        self.lister = lister
        self.hub = hub
        self.players: dict[str, set[Client]] = {}
        self.watching: dict[str, set[str]] = {}  # table id -> its players with a socket here
        self.tables_of: dict[str, set[str]] = {}  # player -> the table ids watched for them
        self.sent: dict[Client, dict[str, Turn]] = {}
        self.dirty: dict[str, set[str]] = {}  # table id -> the players to read it for
        self.relist: set[Client] = set()  # sockets to send their first page again
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        # While a socket's first page is read, every table heard of: those of the player's
        # that changed during the read are read again after it (their events may have come
        # before the player's tables were known here).
        self.loading = 0
        self.heard_meanwhile: set[str] = set()

    def start(self) -> None:
        """Start reading changed tables for the sockets."""
        self.task = asyncio.get_running_loop().create_task(self._refresh(), name="lobby")

    async def stop(self) -> None:
        """Stop reading."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def clients(self) -> list[Client]:
        """Every player socket of this replica."""
        return [c for clients in self.players.values() for c in clients]

    # --- sockets --------------------------------------------------------------------------

    async def open(
        self, ws: web.WebSocketResponse, identity: Identity, transport: asyncio.Transport | None
    ) -> Client:
        """A player socket: its writer, its first page, and its tables watched."""
        client = self.hub.new_client(LOBBY, ws, identity, transport)
        self.players.setdefault(identity.id, set()).add(client)
        self.sent[client] = {}
        self.hub.sockets += 1
        return client

    async def first_page(self, client: Client, now: datetime) -> None:
        """The first page of the caller's open tables, and every open table watched."""
        assert client.identity is not None
        player = client.identity.id
        self.loading += 1
        try:
            async with self.pool.acquire() as conn:
                ids = await open_table_ids(conn, player)
                page = await self.lister.page(conn, player, "open", LIST_LIMIT, None, now)
        finally:
            self.loading -= 1
        changed = self.heard_meanwhile.intersection(ids)
        if not self.loading:
            self.heard_meanwhile.clear()
        for table_id in ids:
            self._watch(table_id, player)
        for table_id in changed:
            self.dirty.setdefault(table_id, set()).add(player)
            self.wake.set()
        sent = self.sent.get(client)
        if sent is None:  # gone meanwhile
            return
        for entry in page.tables:
            sent[entry.table_id] = turn_of(entry)
        self.hub.send(client, _json.encode(PlayerTables(tables=page.tables, next=page.next)))
        client.ready = True

    async def release(self, client: Client) -> None:
        """The socket is done: forgotten as the hub forgets a table's (its queue and transport
        freed), its player's tables unwatched if it was the last."""
        await self.hub.release(client)  # watches no table: only the client's own is freed
        if self.sent.pop(client, None) is None:
            return
        self.hub.sockets -= 1
        assert client.identity is not None
        player = client.identity.id
        clients = self.players.get(player, set())
        clients.discard(client)
        if clients:
            return
        self.players.pop(player, None)
        self._unwatch_all(player)

    def _watch(self, table_id: str, player: str) -> None:
        self.watching.setdefault(table_id, set()).add(player)
        self.tables_of.setdefault(player, set()).add(table_id)

    def _unwatch_all(self, player: str) -> None:
        """Forget every table watched for ``player`` (their last socket is gone)."""
        for table_id in list(self.tables_of.get(player, ())):
            self._unwatch(table_id, player)

    def _unwatch(self, table_id: str, player: str) -> None:
        """Forget that ``player`` watches ``table_id``: by both maps, so a socket's release
        costs its own tables, not every table watched on the replica."""
        who = self.watching.get(table_id)
        if who is not None:
            who.discard(player)
            if not who:
                del self.watching[table_id]
        mine = self.tables_of.get(player)
        if mine is not None:
            mine.discard(table_id)
            if not mine:
                del self.tables_of[player]

    # --- changes ----------------------------------------------------------------------------

    def heard(self, table_id: str, event_type: str, raw: msgspec.Raw) -> None:
        """A table event from the feed: its watchers' entries are read again (a seating event
        may make a new table someone's here)."""
        if not self.players:
            return
        if self.loading:
            self.heard_meanwhile.add(table_id)
        players = set(self.watching.get(table_id, ()))
        if event_type in SEATING:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                data = _seating_decoder.decode(raw).data
                for seated in (data.creator, data.player):
                    if seated is not None and seated.id in self.players:
                        players.add(seated.id)
                        self._watch(table_id, seated.id)
        if players:
            self.dirty.setdefault(table_id, set()).update(players)
            self.wake.set()

    def resync(self) -> None:
        """The feed's channel reopened: the table events nobody here heard meanwhile may
        have changed any player's tables, or made new ones theirs. Each ready player socket
        is sent its first page again (the client's whole list, as after a reconnect)."""
        self.relist.update(c for c in self.clients() if c.ready)
        if self.relist:
            self.wake.set()

    async def _refresh(self) -> None:
        """Send the pages asked again, then read each changed table for its players here and
        send what changed; a failed read is logged and read again after a while."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            relist = [self.relist.pop() for _ in range(min(RELIST_BATCH, len(self.relist)))]
            dirty, self.dirty = self.dirty, {}
            try:
                while relist:  # each taken off once sent: a failure keeps the rest
                    await self._page_again(relist[-1])
                    relist.pop()
                await self._read(dirty)
            except Exception as exc:
                log.warning("lobby_read_failed", error=repr(exc))
                self.relist.update(relist)
                for table_id, players in dirty.items():
                    self.dirty.setdefault(table_id, set()).update(players)
                await asyncio.sleep(1.0)
                self.wake.set()
            if self.relist:  # the next batch, after the changes read meanwhile
                self.wake.set()

    async def _page_again(self, client: Client) -> None:
        """A player socket's first page again, unless it is gone; a player whose last socket
        left during the read watches nothing."""
        if client not in self.sent:
            return
        await self.first_page(client, self.hub.tables.now())
        assert client.identity is not None
        player = client.identity.id
        if player not in self.players:
            self._unwatch_all(player)

    async def _read(self, dirty: dict[str, set[str]]) -> None:
        async with self.pool.acquire() as conn:
            for table_id, players in dirty.items():
                for player in players:
                    if player in self.players:
                        entry = await self.lister.one(conn, player, table_id)
                        self._changed(player, table_id, entry)

    def _changed(self, player: str, table_id: str, entry: MyTable | None) -> None:
        """Send each of the player's sockets the entry if its turn or status moved; a table
        that closed (or is no longer theirs) is watched no more."""
        if entry is None:
            self._unwatch(table_id, player)
            return
        turn = turn_of(entry)
        frame = _json.encode(PlayerTable(table=entry))
        for client in list(self.players.get(player, ())):
            sent = self.sent.get(client)
            if sent is None or not client.ready or sent.get(table_id) == turn:
                continue
            sent[table_id] = turn
            self.hub.send(client, frame)
        if entry.status not in OPEN:
            self._unwatch(table_id, player)


LOBBY_KEY = web.AppKey("lobby", Lobby)
