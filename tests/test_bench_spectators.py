"""The spectators bench's own client (bench/watchers.py): what it reads of the 101's
extension, and how it turns frames into messages, plain and permessage-deflate (RFC 7692),
with and without context takeover. No service: frames made here with zlib."""

from __future__ import annotations

import zlib

import pytest

from bench.watchers import ProtocolError, Reader, negotiated


def frame(payload: bytes, opcode: int = 0x1, fin: bool = True, rsv1: bool = False) -> bytes:
    """One unmasked frame, as a server sends it."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    size = len(payload)
    if size < 126:
        head = bytes([first, size])
    elif size < 1 << 16:
        head = bytes([first, 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([first, 127]) + size.to_bytes(8, "big")
    return head + payload


def deflated(message: bytes, compressor: zlib._Compress | None = None) -> bytes:
    """A message compressed as RFC 7692 sends it: a sync flush, its 00 00 ff ff cut off."""
    compressor = compressor or zlib.compressobj(wbits=-15)
    data = compressor.compress(message) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert data.endswith(b"\x00\x00\xff\xff")
    return data[:-4]


EVENT = b'{"kind":"event","seq":7,"event":{"type":"draw","seat":0}}' * 3


def test_a_compressed_frame_inflates_with_a_fresh_decompressor_per_message() -> None:
    reader = Reader(deflate=True, no_context_takeover=True)
    wire = [deflated(EVENT), deflated(EVENT)]  # each compressed on its own
    got = reader.feed(frame(wire[0], rsv1=True) + frame(wire[1], rsv1=True))
    assert got == [(0x1, EVENT, len(wire[0]), True), (0x1, EVENT, len(wire[1]), True)]


def test_context_takeover_keeps_one_decompressor_for_the_socket() -> None:
    compressor = zlib.compressobj(wbits=-15)
    first, second = deflated(EVENT, compressor), deflated(EVENT, compressor)
    assert len(second) < len(first)  # the second refers back to the first
    reader = Reader(deflate=True, no_context_takeover=False)
    assert [m[1] for m in reader.feed(frame(first, rsv1=True))] == [EVENT]
    assert [m[1] for m in reader.feed(frame(second, rsv1=True))] == [EVENT]
    # A fresh decompressor cannot read it: the takeover is what the persistent one is for.
    with pytest.raises(ProtocolError):
        Reader(deflate=True, no_context_takeover=True).feed(frame(second, rsv1=True))


def test_a_frame_without_rsv1_is_plain_even_when_deflate_was_negotiated() -> None:
    reader = Reader(deflate=True, no_context_takeover=True)
    assert reader.feed(frame(b'{"kind":"event","seq":1}')) == [
        (0x1, b'{"kind":"event","seq":1}', 24, False)
    ]


def test_rsv1_without_deflate_negotiated_fails_loudly() -> None:
    with pytest.raises(ProtocolError):
        Reader().feed(frame(deflated(EVENT), rsv1=True))


def test_frames_split_anywhere_and_fragmented_messages_come_whole() -> None:
    reader = Reader(deflate=True, no_context_takeover=True)
    body = deflated(EVENT * 40)  # past 125 bytes: a 16-bit length
    wire = (
        frame(body[:10], fin=False, rsv1=True)
        + frame(b"hi", opcode=0x9)  # a ping between the fragments
        + frame(body[10:], opcode=0x0)
    )
    got = []
    for i in range(0, len(wire), 7):
        got += reader.feed(wire[i : i + 7])
    assert got == [(0x9, b"hi", 2, False), (0x1, EVENT * 40, len(body), True)]
    with pytest.raises(ProtocolError):
        Reader().feed(frame(b"x", opcode=0x0))  # a continuation of nothing


def test_the_extension_answered() -> None:
    assert negotiated(None, offered=True) == (False, False)
    assert negotiated("permessage-deflate", offered=True) == (True, False)
    assert negotiated(
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover", True
    ) == (True, True)
    assert negotiated("permessage-deflate; client_max_window_bits=15", True) == (True, False)
    for malformed in (
        "x-webkit-deflate-frame",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; something_else",
        "permessage-deflate, permessage-deflate",
    ):
        with pytest.raises(ProtocolError):
            negotiated(malformed, offered=True)
    with pytest.raises(ProtocolError):
        negotiated("permessage-deflate", offered=False)
