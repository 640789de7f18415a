"""permessage-deflate for the table's sockets: each frame compressed once for all who get it.

Every browser offers permessage-deflate (RFC 7692). Left to aiohttp, each socket that
accepts it keeps a compressor of its own (a deflate window and hash tables, for as long as
the socket is open) and compresses every frame again for itself: a spectator costs several
times the memory of a plain one, and a fan-out several times the CPU.

The table answers instead with ``server_no_context_takeover`` and
``client_no_context_takeover`` (both the server's to add, RFC 7692 7.1.1): each message is
compressed on its own, so a frame's compressed bytes are the same for every socket, and
are made once, here, and kept while the sockets it was queued for send it. Frames too
small to gain are sent plain (RSV1 clear), which the extension allows message by message.
How a socket negotiates and writes these is aiohttp's, reached in
``shared/infra/internals.py`` (``SharedDeflateResponse``).
"""

from __future__ import annotations

import zlib

from cachetools import LRUCache

# Below this a frame is sent as it is: deflate's block header and the little a short JSON
# repeats leave nothing worth a compression per frame (docs/DESIGN.md §7, the figures).
MIN_BYTES = 256
# Frames whose compressed bytes are kept: those of one delivery (an event for each view at
# a table, a snapshot for each version) are sent within moments of one another, so a few
# thousand serve every burst; an evicted one is compressed again, never wrong.
FRAMES_KEPT = 4096
# The window the server compresses with (bits). A client may ask for a smaller one with
# ``server_max_window_bits``; such frames are compressed apart.
WINDOW_BITS = 15
# Compression level: each frame is compressed once for many sockets, so the better ratio
# of a middle level costs little per socket; a seated player's own frames are few.
LEVEL = 6
MEM_LEVEL = 8


class Deflater:
    """Frames compressed once each, raw deflate with no context carried between them."""

    def __init__(self, kept: int = FRAMES_KEPT, min_bytes: int = MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        # Keyed by the frame itself: the hub hands every watcher of a view the same bytes
        # object, whose hash is computed once and whose comparison is then by identity.
        self._kept: dict[int, LRUCache[bytes, bytes | None]] = {}
        self._size = kept

    def deflate(self, frame: bytes, window_bits: int = WINDOW_BITS) -> bytes | None:
        """The frame's payload as a compressed message (RFC 7692 7.2.1: the trailing
        ``00 00 ff ff`` removed), or None to send it plain (too small, or no smaller)."""
        if len(frame) < self.min_bytes:
            return None
        kept = self._kept.get(window_bits)
        if kept is None:
            kept = self._kept[window_bits] = LRUCache(self._size)
        try:
            return kept[frame]
        except KeyError:
            pass
        payload: bytes | None = compress(frame, window_bits)
        if payload is not None and len(payload) >= len(frame):
            payload = None
        kept[frame] = payload
        return payload


def compress(frame: bytes, window_bits: int = WINDOW_BITS) -> bytes:
    """One message compressed on its own: raw deflate ended by a sync flush, whose empty
    block's ``00 00 ff ff`` the receiver puts back (RFC 7692 7.2.1 and 7.2.2)."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -window_bits, MEM_LEVEL)
    data = compressor.compress(frame) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return data.removesuffix(b"\x00\x00\xff\xff")
