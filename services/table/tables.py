"""The table service's commands: load, decide, save, whichever way a command arrives.

Each coroutine that takes a store (``port.TableStore``: PostgreSQL in the caller's
transaction, or its in-memory twin) runs inside that transaction: it loads
the table (its row locked), asks ``decide`` (pure: services/table/decide.py) what the command
makes of it, and saves the change (state, events with gap-free seq, hand records, outbox rows,
deadlines, the command's result) before the caller commits. ``command_at_once`` decides on
the row this replica last committed and saves it in one statement, if still current. Each
way reads the clock once, the locked way after the row's lock is taken: a command that waited
behind another's commit is dated after it, so a table's events never go back in time.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import msgspec
from cachetools import LRUCache

from services.table import store
from services.table.deadlines import at
from services.table.decide import (
    BOT_NAMES,
    Actor,
    Deal,
    Decision,
    Rejected,
    bot_turn,
    check_sender,
    decide,
    opened,
    seat_of,
    sit,
    view,
)
from services.table.memory import ROWS_KEPT, TableMemory
from services.table.port import TableStore
from services.table.store import TableRow
from shared.contracts import commands as c
from shared.contracts.api import CommandResult, TableCreatedResponse
from shared.contracts.events import BotLevel, Player
from shared.contracts.options import TableOptions
from shared.contracts.views import TableView
from shared.engine import IllegalAction, Timing
from shared.infra import tracing
from shared.infra.auth import Identity

__all__ = ["Actor", "Rejected", "Tables", "secure_shuffle"]
_json = msgspec.json.Encoder()
Shuffle = Deal
SaveIfCurrent = Callable[[store.Attempt], Awaitable[bool]]


def secure_shuffle() -> tuple[list[int], str, int]:
    """A deck from the operating system's secure source, a salt and a lot (R3.2, R3.5)."""
    deck = list(range(52))
    secrets.SystemRandom().shuffle(deck)
    return deck, secrets.token_hex(16), secrets.randbelow(2)


class Tables:
    """Loads, decides and saves every command of the table service."""

    def __init__(
        self,
        public_url: str,
        absence_after_s: float,
        expiry_after_s: float,
        clock: Callable[[], float] = time.time,
        shuffle: Shuffle = secure_shuffle,
        bot_resend_s: float = 30.0,
        rows_kept: int = ROWS_KEPT,
    ) -> None:
        self.public_url = public_url.rstrip("/")
        self.bot_resend_after = timedelta(seconds=bot_resend_s)
        self.absence_after_s = absence_after_s
        self.expiry_after_s = expiry_after_s
        self.clock = clock
        self.shuffle = shuffle
        self.memory = TableMemory(rows_kept)

    @property
    def seatings(self) -> LRUCache[str, store.Seating]:
        """The full seatings this replica remembers, by table id."""
        return self.memory.seatings

    def timing(self) -> Timing:
        """Now, with the absence and expiry durations: the one clock reading of a command."""
        return Timing(self.clock(), self.absence_after_s, self.expiry_after_s)

    def now(self) -> datetime:
        """The service's clock, as an aware UTC datetime."""
        return at(self.clock())

    def table_view(self, row: TableRow, seat: int | None, deck_design: str | None) -> TableView:
        """What a seat (None: a spectator) may see of a table now."""
        return view(row, seat, deck_design, self.timing())

    # --- the table lifecycle (R10.1) -------------------------------------------------------

    async def create(
        self, db: TableStore, identity: Identity, options: TableOptions
    ) -> tuple[TableCreatedResponse, store.Change]:
        """A new table with its creator in seat 0, waiting for an opponent."""
        timing = self.timing()
        now = at(timing.now)
        row = TableRow(
            table_id=secrets.token_urlsafe(9),
            invite_code=secrets.token_urlsafe(16),
            creator_id=identity.id,
            options=options,
            seats=[Player(id=identity.id, name=identity.name), None],
            status="waiting",
            state=None,
            version=0,
            seq=0,
            created_at=now,
            last_move_at=now,
        )
        await db.insert_table(row)
        design = await db.deck_design(identity.id)
        decision = opened(row, timing, design)
        change = self._change(decision)
        await db.save_change(change)
        created = TableCreatedResponse(
            table_id=row.table_id,
            invite_code=row.invite_code,
            invite_url=f"{self.public_url}/tables/{row.table_id}?invite={row.invite_code}",
            seat=0,
            view=decision.view,
        )
        return created, change

    async def join(
        self, db: TableStore, table_id: str, identity: Identity, code: str
    ) -> tuple[CommandResult, store.Change]:
        """Take the free seat with the invitation code; the match starts (R10.1)."""
        seating = await self.seating(db, table_id)
        self._check_invitation(seating, identity, code)  # before the lock: a flood waits on none
        locked = await self._lock(db, table_id, player=identity.id)
        self._check_invitation(self.memory.seating_of_row(locked.row), identity, code)
        player = Player(id=identity.id, name=identity.name)
        return await self._sit(db, locked, player, identity)

    async def seat_bot(
        self, db: TableStore, table_id: str, identity: Identity, level: BotLevel
    ) -> tuple[CommandResult, store.Change]:
        """The creator fills the free seat with a bot; the match starts (R10.1)."""
        if (await self.seating(db, table_id)).creator_id != identity.id:  # before the lock
            raise Rejected("not_creator", "only the table's creator seats a bot", "R10.1")
        locked = await self._lock(db, table_id, player=identity.id)
        if locked.row.status != "waiting":
            raise Rejected("seat_taken", "both seats are taken", "R10.1")
        bot = Player(name=BOT_NAMES[level], bot=level)
        return await self._sit(db, locked, bot, identity)

    async def _sit(
        self, db: TableStore, locked: store.Locked, player: Player, caller: Identity
    ) -> tuple[CommandResult, store.Change]:
        decision = sit(
            locked.row, player, caller.id, self.timing(), self.shuffle, locked.deck_design
        )
        change = self._change(decision)
        await db.save_change(change)
        result = CommandResult(
            version=decision.row.version, events=decision.envelopes, view=decision.view
        )
        return result, change

    # --- commands --------------------------------------------------------------------------

    async def command(
        self, db: TableStore, table_id: str, actor: Actor, cmd: c.Command
    ) -> tuple[bytes, store.Change | None]:
        """Apply one command in the caller's transaction: the result as JSON and the change
        (none for a repeat of a ``command_id``: it returns the first result, changes nothing)."""
        check_sender(actor, cmd)
        player = actor.person
        if player is not None:  # a spectator is refused before the lock, most often from memory
            await self._check_seated(db, table_id, player)
        locked = await self._lock(db, table_id, cmd.command_id, player, actor.label)
        self.memory.seating_of_row(locked.row)
        if player is not None:
            self.memory.keep_design(player, locked.deck_design)
        seat_of(locked.row, actor)  # a stranger's command id tells nothing
        if locked.prior is not None:  # this actor's own: ids are scoped by who sends them
            return locked.prior.encode(), None
        decision = decide(locked.row, actor, cmd, self.timing(), self.shuffle, locked.deck_design)
        change, result = self._answered(
            decision, locked.row.version, cmd, actor, locked.deck_design
        )
        await db.save_change(change)
        return result, change

    def committed(self, row: TableRow) -> None:
        """A row as just committed: a person's next command at its table may be decided on it
        (``command_at_once``)."""
        self.memory.committed(row)

    async def command_at_once(
        self, save: SaveIfCurrent, table_id: str, actor: Actor, cmd: c.Command
    ) -> tuple[bytes, store.Change] | None:
        """A person's command decided on the table's remembered row and saved by ``save``
        (``GroupCommit.save``: in one statement, outside any transaction, with others) if the
        table is still at that version (and the person's deck design as remembered); None
        when it is not for this way: nothing remembered, a refusal, a version or design moved
        on, a command_id used already, another command at the table under way. The caller
        then takes the locked way (``command``), which refuses or answers a repeated
        command_id as it always did: this way only ever applies."""
        remembered = self.memory.row(table_id)
        player = actor.person
        if remembered is None or player is None:
            return None
        known, design = self.memory.design(player)
        if not known:
            return None
        try:
            decision = decide(remembered, actor, cmd, self.timing(), self.shuffle, design)
        except (Rejected, IllegalAction):
            return None
        change, result = self._answered(decision, remembered.version, cmd, actor, design)
        attempt = store.Attempt(
            change=change, version=remembered.version, player=player, design=design
        )
        if not await save(attempt):
            self.memory.forget_row(table_id)
            return None
        return result, change

    def _answered(
        self, decision: Decision, version: int, cmd: c.Command, actor: Actor, design: str | None
    ) -> tuple[store.Change, bytes]:
        """The change to save for a decision, with the command's answer kept in it."""
        change = self._change(decision)
        change.views[(decision.seat, design)] = decision.view
        result = _json.encode(
            CommandResult(
                version=decision.row.version, events=decision.envelopes, view=decision.view
            )
        )
        if cmd.command_id is not None:
            change.command_id, change.actor, change.result = cmd.command_id, actor.label, result
        return change, result

    def _change(self, decision: Decision) -> store.Change:
        """What saving a decision writes."""
        row = decision.row
        due = None if decision.bot_turn is None else row.last_move_at + self.bot_resend_after
        encoded, outbox, hands = store.change_of(
            row.table_id, decision.envelopes, decision.hands, decision.bot_turn
        )
        return store.Change(
            row=row,
            envelopes=decision.envelopes,
            encoded=encoded,
            outbox=outbox,
            hands=hands,
            bot_turn_due_at=due,
            traceparent=tracing.traceparent(),
        )

    def bot_turn_message(self, row: TableRow, resent: str = "") -> store.OutboxRow | None:
        """The outbox row of the bot's turn at this version, if a bot has the turn."""
        turn = bot_turn(row, self.timing())
        return None if turn is None else store.bot_turn_row(turn, resent)

    # --- refusals before the row lock -------------------------------------------------------

    def refuse_from_memory(self, table_id: str, actor: Actor, cmd: c.Command) -> None:
        """The refusals that need no database at all: the wrong sender for the command, and
        a spectator at a table whose full seating is remembered (a flood from one costs no
        connection)."""
        check_sender(actor, cmd)
        seating = self.memory.seating(table_id)
        person = actor.person
        if seating is not None and person is not None and person not in seating.people:
            raise Rejected("not_seated", "spectators watch and do not play", "R10.1")

    async def seating(self, db: TableStore, table_id: str) -> store.Seating:
        """A table's seating: remembered if full, else read without a lock (404 if none)."""
        seating = self.memory.seating(table_id)
        if seating is None:
            seating = await db.read_seating(table_id)
            if seating is None:
                raise Rejected("no_such_table", f"there is no table {table_id!r}")
            self.memory.keep_seating(table_id, seating)
        return seating

    async def _check_seated(self, db: TableStore, table_id: str, player: str) -> None:
        # A seating not full is never remembered, so it was just read: a join made at another
        # replica a moment ago is in it.
        if player not in (await self.seating(db, table_id)).people:
            raise Rejected("not_seated", "spectators watch and do not play", "R10.1")

    @staticmethod
    def _check_invitation(seating: store.Seating, identity: Identity, code: str) -> None:
        if not secrets.compare_digest(code.encode(), seating.invite_code.encode()):
            raise Rejected("bad_invite_code", "this invitation code is not this table's")
        if identity.id in seating.people:
            raise Rejected("already_seated", "you are seated at this table already", "R10.1")

    async def _lock(
        self,
        db: TableStore,
        table_id: str,
        command_id: str | None = None,
        player: str | None = None,
        actor: str | None = None,
    ) -> store.Locked:
        locked = await db.lock_for_command(table_id, command_id, player, actor)
        if locked is None:
            raise Rejected("no_such_table", f"there is no table {table_id!r}")
        return locked
