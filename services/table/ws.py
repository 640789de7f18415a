"""The table WebSocket: a snapshot on connect, then every event with the viewer's new view.

Each replica has one exclusive queue, so it works with any number of replicas. A replica
delivers its own commits to its clients without the broker hop: the command hands the change
to the hub's inbox and answers at once; the hub's task delivers it after the response. Every
table event reaches every replica's queue from ``gin.sockets``, one message per relay batch;
a replica sends on those of the tables its clients watch that it has not sent yet (another
replica committed them). Chat and timer events come from ``gin.events``, bound for the tables
its clients watch. Events come at least once and in order per table; a client is sent each
seq once, and a gap (a lost message, a reconnect) is filled from the table's event log before
the next event goes out.

Nothing here waits on a client: each socket has a bounded queue of frames and its own writer,
and a client whose queue is full is closed as too slow; every close is bounded in time.

Its parts, by job (this module names what the rest of the product imports):
- ``sockets.py``: the route ``GET /v1/tables/{id}/ws``, and the frames a client sends;
- ``clients.py``: one socket: its bounded queue, its writer, its close, the close codes;
- ``hub.py``: the sockets by table, the delivery of commits, catch-up after a gap, retries;
- ``known.py``: the newest row of each watched table, for new sockets' snapshots;
- ``frames.py``: each event with each viewer's view, encoded once and shared;
- ``feed.py``: the broker side: this replica's queue and its bindings.
"""

from __future__ import annotations

from services.table.clients import (
    ARCHIVED_REASON,
    CLOSE_ARCHIVED,
    CLOSE_GOING_AWAY,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_TIMEOUT_S,
    CLOSE_TOKEN_EXPIRED,
    CLOSE_TOO_SLOW,
    CLOSE_TRY_AGAIN_LATER,
    GOING_AWAY_REASON,
    TOKEN_EXPIRED_REASON,
    TOO_SLOW_REASON,
    TRY_AGAIN_REASON,
    WRITER_LIMIT_BYTES,
    Client,
    SocketMetrics,
)
from services.table.frames import event_frame
from services.table.hub import HUB, Hub
from services.table.sockets import FILES, MEMORY, add_socket_route, table_socket

__all__ = [
    "ARCHIVED_REASON",
    "CLOSE_ARCHIVED",
    "CLOSE_GOING_AWAY",
    "CLOSE_MESSAGE_TOO_BIG",
    "CLOSE_TIMEOUT_S",
    "CLOSE_TOKEN_EXPIRED",
    "CLOSE_TOO_SLOW",
    "CLOSE_TRY_AGAIN_LATER",
    "FILES",
    "GOING_AWAY_REASON",
    "HUB",
    "MEMORY",
    "TOKEN_EXPIRED_REASON",
    "TOO_SLOW_REASON",
    "TRY_AGAIN_REASON",
    "WRITER_LIMIT_BYTES",
    "Client",
    "Hub",
    "SocketMetrics",
    "add_socket_route",
    "event_frame",
    "table_socket",
]
