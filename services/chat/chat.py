"""Posting a message and reading the history (R10.5), each inside the caller's transaction.

Who may write is what the chat learned from the table's events (``consumer.py``): the person
in a seat. Nobody else, a spectator or anyone claiming a bot's seat, ever writes; a bot seat
has no player id, so no token matches it. Each message gets the table's next number (gap-free,
from 1) and is stored together with its ``message_posted`` envelope in the outbox, so a
message is never stored without being published.

The chat learns seats some milliseconds after the table service seats someone: a sender who
says which table version it has seen (``after_version``) and whom the chat does not see seated
yet gets ``Behind`` while the chat may still be learning that version (the caller waits and
tries again), never a refusal.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from services.chat import store
from services.chat.rules import (
    RATE_COUNT,
    RATE_WINDOW,
    RATE_WINDOW_S,
    InvalidText,
    clean_text,
    retry_after_s,
)
from services.chat.store import StoredMessage
from shared.contracts.envelope import Envelope
from shared.contracts.events import MessagePosted
from shared.contracts.names import EVENTS_EXCHANGE, chat_key
from shared.infra import outbox
from shared.infra.auth import Identity
from shared.infra.db import Conn
from shared.infra.web import Refused

_json = msgspec.json.Encoder()
SEATS = 2


class Behind(Exception):
    """The chat has not applied the table version the sender has seen: it may yet learn that
    the sender is seated. Try again shortly."""


def may_be_behind(posting: store.Posting | None, after_version: int | None) -> bool:
    """Whether a sender the chat does not see seated may be seated at ``after_version``.

    Seats are only ever filled (R10.1): once the chat knows both, nobody else will be seated.
    Else the chat is behind while it has applied no event of ``after_version`` or later (the
    creator's seat comes with the table's first event, so a table the chat does not know yet
    is behind too). Without ``after_version`` the chat answers from what it knows.
    """
    if after_version is None:
        return False
    if posting is None:
        return True
    return posting.seats_known < SEATS and posting.version < after_version


def envelope_of(message: StoredMessage) -> Envelope:
    """The ``message_posted`` envelope of a stored message: the one published, byte for byte."""
    return Envelope(
        id=message.event_id,
        type="message_posted",
        table_id=message.table_id,
        stream="chat",
        seq=message.seq,
        occurred_at=message.posted_at.astimezone(UTC),
        data=MessagePosted(
            message_id=message.seq, seat=message.seat, name=message.name, text=message.text
        ),
    )


class Chat:
    """The chat of every table, reading time from one injectable clock."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def now(self) -> datetime:
        """The clock's time."""
        return datetime.fromtimestamp(self.clock(), UTC)

    async def post(
        self,
        conn: Conn,
        table_id: str,
        identity: Identity,
        raw: str,
        after_version: int | None = None,
    ) -> Envelope:
        """Store and publish one message of a seated person; its envelope. ``Behind`` when the
        sender is not seated as far as the chat knows, but may be at ``after_version``."""
        try:
            text = clean_text(raw)
        except InvalidText as exc:
            raise Refused(400, "invalid_text", str(exc)) from exc
        posting = await store.lock_for_posting(conn, table_id, identity.id)
        if (posting is None or posting.seat is None) and may_be_behind(posting, after_version):
            raise Behind(table_id)
        if posting is None:
            raise Refused(404, "no_such_table", "the chat knows no such table")
        if posting.seat is None or posting.name is None:
            raise Refused(
                403, "spectators_cannot_chat", "only the players seated here write", "R10.5"
            )
        if posting.status != "open":
            raise Refused(
                409,
                "table_closed",
                f"this table is {posting.status}: its chat is read-only",
                "R10.5",
            )
        now = self.now()
        wait = retry_after_s(
            await store.recent_posts(conn, identity.id, now - RATE_WINDOW, RATE_COUNT), now
        )
        if wait is not None:
            raise Refused(
                429,
                "too_many_messages",
                f"at most {RATE_COUNT} messages per {RATE_WINDOW_S:g} s: wait {wait} s",
                headers={"Retry-After": str(wait)},
            )
        message = StoredMessage(
            table_id=table_id,
            seq=posting.last_message + 1,
            event_id=uuid.uuid4(),
            seat=posting.seat,
            player_id=identity.id,
            name=posting.name,
            text=text,
            posted_at=now,
        )
        await store.insert_message(conn, message)
        envelope = envelope_of(message)
        body = _json.encode(envelope)
        await outbox.add_many(conn, [(EVENTS_EXCHANGE, chat_key(table_id), body, str(envelope.id))])
        return envelope

    async def history(self, conn: Conn, table_id: str, after: int, limit: int) -> list[Envelope]:
        """The envelopes of a table's messages numbered above ``after``, at most ``limit``."""
        messages = await store.messages_after(conn, table_id, after, limit)
        if not messages and await store.table_status(conn, table_id) is None:
            raise Refused(404, "no_such_table", "the chat knows no such table")
        return [envelope_of(m) for m in messages]
