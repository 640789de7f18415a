"""The frames the hub sends of table events: each event with each viewer's own view.

A commit is one event (or a few) sent to every socket at the table, each with the view of
its viewer: its seat's hand, or the spectators' view, in its deck design. Each event and
each view is encoded once, and each (event, view) frame spliced once from those bytes,
shared by every client that sees that view (the spectators share one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec

from services.table.clients import Client
from services.table.store import TableRow
from shared.contracts.envelope import Envelope
from shared.contracts.views import TableView

_json = msgspec.json.Encoder()

ViewKey = tuple[int | None, str | None]  # (seat, deck design): who sees the same view
# The view of a seat (None: a spectator) in a deck design, made from the row.
ViewOf = Callable[[TableRow, int | None, str | None], TableView]


def event_frame(event: bytes, view: bytes) -> bytes:
    """A ``WsEvent`` from its event and view already encoded (as msgspec would write it)."""
    return b'{"kind":"event","event":' + event + b',"view":' + view + b"}"


def event_frames(
    clients: list[Client],
    row: TableRow,
    events: dict[int, Envelope],
    views: dict[ViewKey, TableView],
    view_of: ViewOf,
) -> Iterator[tuple[Client, int, bytes]]:
    """Each client's frame of each event past its ``last_seq``, in seq order, as (client,
    seq, frame): the caller sends it and moves ``last_seq`` on before the next is made.
    A view not in ``views`` is made with ``view_of``."""
    encoded_events: dict[int, bytes] = {}
    encoded_views: dict[ViewKey, bytes] = {}
    frames: dict[tuple[int, ViewKey], bytes] = {}
    order = sorted(events)
    for client in clients:
        seat = row.seat_of(client.identity.id if client.identity else None)
        key = (seat, client.deck_design)
        for seq in order:
            if seq <= client.last_seq:
                continue
            frame = frames.get((seq, key))
            if frame is None:
                if key not in encoded_views:
                    view = views.get(key)
                    if view is None:
                        view = view_of(row, seat, client.deck_design)
                    encoded_views[key] = _json.encode(view)
                if seq not in encoded_events:
                    encoded_events[seq] = _json.encode(events[seq])
                frame = event_frame(encoded_events[seq], encoded_views[key])
                frames[(seq, key)] = frame
            yield client, seq, frame
