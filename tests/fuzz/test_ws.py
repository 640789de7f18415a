"""Hypothesis-made frames on the table WebSocket of the real table service.

Each frame gets exactly one answer, and a clear one: an error frame of the one error shape,
or a close with the code that names the fault (1009 past ``ws_max_frame_bytes``, 1007 for a
text frame that is not UTF-8), never 1011 or a dropped connection, never silence; the service
stays up, and the table is as it was (same version, same number of events).

Who sends them: three viewers of a table with a hand on. A spectator and an anonymous viewer
(no token) can never change the table, so every frame of theirs is fair game. The seated
player whose frames these are could make a legal move, so each of its command-shaped frames
carries an ``expected_version`` that is not the table's: the frame still goes through
decoding, the token, the seat and the command id before the version refuses it, which is
deeper than a spectator's frames get, and it still may not change a thing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_args

import aiohttp
import msgspec
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from services.table.ws import CLOSE_MESSAGE_TOO_BIG
from shared.contracts.commands import AnyCommand
from shared.engine import CARDS
from tests.fuzz.conftest import Services, World, assert_error_shape, examples
from tests.fuzz.tally import ANSWERS, CASES

FRAMES = int(os.environ.get("GIN_FUZZ_FRAMES", "300"))
ANSWER_WITHIN_S = 2.0
CLOSE_INVALID_TEXT = 1007
TAGS = [t.__struct_config__.tag for t in get_args(AnyCommand)]
FIELDS = ["command_id", "expected_version", "source", "card", "melds", "deadwood"]


@dataclass(frozen=True)
class Frame:
    """One WebSocket message to send: its type, its payload, and the answer it is owed."""

    text: bool
    payload: bytes
    expect_close: int | None = None  # the close code it must get, or None: an error frame

    def __repr__(self) -> str:
        kind = "text" if self.text else "binary"
        head = self.payload[:300]
        return f"Frame({kind}, {len(self.payload)} bytes, {head!r}, close={self.expect_close})"


# --- the frames -------------------------------------------------------------------------------

# Strings with what breaks decoders: NUL, other controls, non-ASCII, lone surrogates
# (JSON escapes them), separators JavaScript reads as line ends, a byte-order mark.
awkward_text = st.text(
    st.characters(codec=None, min_codepoint=0)
    | st.sampled_from(["\x00", "\x7f", "\ud800", "\udfff", "\u2028", "\ufeff", "é", "🂡"]),
    max_size=40,
)
numbers = (
    st.integers()
    | st.integers(min_value=2**31 - 2, max_value=2**31 + 2)
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.integers(min_value=-(2**64), max_value=-(2**63) + 2)
    | st.sampled_from([10**400, -(10**400)])
    | st.floats()
)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | awkward_text,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(awkward_text | st.sampled_from(FIELDS), inner, max_size=4)
    ),
    max_leaves=12,
)
field_values = {
    "command_id": awkward_text | st.text("abc.:_~-", min_size=1, max_size=120) | json_values,
    "expected_version": numbers | json_values,
    "source": st.sampled_from(["stock", "discard"]) | json_values,
    "card": st.sampled_from(["As", "Td", "10h", "Kx", ""]) | awkward_text | json_values,
    "melds": st.lists(st.lists(st.sampled_from(["As", "2s", "3s", "Zz"]), max_size=12))
    | json_values,
    "deadwood": numbers | json_values,
}
commands = st.fixed_dictionaries(
    {"type": st.sampled_from(TAGS) | awkward_text | json_values},
    optional={**field_values, "surplus": json_values},
)
CARD_NAMES = [str(card) for card in CARDS]
# What each field of a command holds when it is right.
right = {
    "command_id": st.from_regex(r"\A[A-Za-z0-9._:~-]{1,100}\Z"),
    "expected_version": st.integers(min_value=0, max_value=2**31 - 1),
    "source": st.sampled_from(["stock", "discard"]),
    "card": st.sampled_from(CARD_NAMES),
    "melds": st.lists(st.lists(st.sampled_from(CARD_NAMES), min_size=3, max_size=4), max_size=3),
    "deadwood": st.integers(min_value=0, max_value=1000),
}


def well_formed(kind: type[msgspec.Struct]) -> st.SearchStrategy[dict[str, Any]]:
    """A command of this type that decodes: its tag, every required field, some optional."""
    fields = msgspec.structs.fields(kind)
    return st.fixed_dictionaries(
        {
            "type": st.just(kind.__struct_config__.tag),
            **{f.name: right[f.name] for f in fields if f.required},
        },
        optional={f.name: right[f.name] for f in fields if not f.required},
    )


well_formed_commands = st.sampled_from(get_args(AnyCommand)).flatmap(well_formed)
# One field wrong: the type, the value or the bounds of it.
one_wrong = st.builds(
    lambda command, field, value: {**command, field: value},
    well_formed_commands,
    st.sampled_from(FIELDS),
    json_values | numbers | awkward_text,
)
messages = st.fixed_dictionaries(
    {"kind": st.just("command") | awkward_text | json_values},
    optional={"command": commands | json_values, "extra": json_values},
)


def nested(depth: int, kind: str) -> str:
    """JSON nested ``depth`` deep (a decoder that recurses must stop in time)."""
    if kind == "array":
        return "[" * depth + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return '{"kind":"command","command":' + '{"type":' * depth + '"draw"' + "}" * depth + "}"


def as_json(value: Any, ascii_only: bool) -> bytes:
    """JSON text (NaN and Infinity included, as JavaScript writes them) in UTF-8."""
    text = json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: only its \\u escape can be sent
        return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


def frames(max_bytes: int) -> st.SearchStrategy[Frame]:
    """Every kind of message, each with the answer it is owed."""
    json_frame = st.builds(
        lambda value, ascii_only, text: Frame(text, as_json(value, ascii_only)),
        messages | json_values,
        st.booleans(),
        st.booleans(),
    )
    command_frame = st.builds(
        lambda command: Frame(True, as_json({"kind": "command", "command": command}, True)),
        well_formed_commands | one_wrong,
    )
    not_json = st.builds(lambda s: Frame(True, s.encode()), st.text(max_size=200))
    raw_binary = st.builds(lambda b: Frame(False, b), st.binary(max_size=400))
    deep = st.builds(
        lambda depth, kind: Frame(True, nested(depth, kind).encode()),
        # shallow, or far past the interpreter's recursion limit (1000), never near it (where
        # the outcome hangs on the stack the server is at)
        st.integers(min_value=1, max_value=300)
        | st.integers(min_value=1500, max_value=(max_bytes - 64) // 9),
        st.sampled_from(["array", "object", "command"]),
    )
    # A text frame that is not UTF-8: a bad byte, a truncated sequence, an encoded surrogate.
    not_utf8 = st.builds(
        lambda head, bad, tail: Frame(
            True, head.encode() + bad + tail.encode(), CLOSE_INVALID_TEXT
        ),
        st.text(max_size=50),
        st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf"]),
        st.text(alphabet="abc", max_size=10),
    )
    oversized = st.builds(
        lambda size, text: Frame(
            text,
            b'{"kind":"command","command":{"type":"draw","source":"' + b"x" * size + b'"}}',
            CLOSE_MESSAGE_TOO_BIG,
        ),
        st.integers(min_value=max_bytes, max_value=4 * max_bytes),
        st.booleans(),
    )
    # Commands that decode, or nearly, most often: they get furthest into the server.
    return st.one_of(
        *[command_frame] * 4, json_frame, not_json, raw_binary, deep, not_utf8, oversized
    )


def stale(frame: Frame, version: int, max_bytes: int) -> Frame:
    """The frame with every command in it made to carry an ``expected_version`` that is not
    the table's (a seated player's frame may be a legal move otherwise); one the rewrite made
    larger than ``max_bytes`` is owed the close 1009."""
    if frame.expect_close is not None:
        return frame
    try:
        value = json.loads(frame.payload)
        if not (isinstance(value, dict) and isinstance(value.get("command"), dict)):
            return frame
        # Python's json keeps a duplicate key's last value, as msgspec reads it.
        command = {k: v for k, v in value["command"].items() if k != "expected_version"}
        ev = value["command"].get("expected_version")
        command["expected_version"] = ev if type(ev) is int and ev != version else version + 1
        payload = as_json({**value, "command": command}, ascii_only=True)
        too_big = CLOSE_MESSAGE_TOO_BIG if len(payload) > max_bytes else None
        return Frame(frame.text, payload, too_big)
    except (ValueError, RecursionError):  # not JSON, or too deep to be a command's
        return frame


# --- the socket -------------------------------------------------------------------------------


class NoAnswer(AssertionError):
    """The server never answered a frame."""


class Socket:
    """One viewer's WebSocket at a table, opened again after the server closes it."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def open(self) -> aiohttp.ClientWebSocketResponse:
        if self.ws is None or self.ws.closed:
            self.ws = await self.session.ws_connect(self.url, max_msg_size=0, heartbeat=None)
            first = await self.ws.receive(timeout=ANSWER_WITHIN_S)
            assert first.type == aiohttp.WSMsgType.TEXT, first
            assert json.loads(first.data)["kind"] == "snapshot", first.data[:200]
        return self.ws

    async def answer(self, frame: Frame) -> aiohttp.WSMessage:
        """Send one frame; the first thing that comes back."""
        ws = await self.open()
        if frame.text:
            await ws.send_frame(frame.payload, aiohttp.WSMsgType.TEXT)
        else:
            await ws.send_bytes(frame.payload)
        try:
            return await asyncio.wait_for(ws.receive(), ANSWER_WITHIN_S)
        except TimeoutError:
            await ws.close()  # the next frame starts on a new socket
            raise NoAnswer(f"no answer within {ANSWER_WITHIN_S} s") from None

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


@dataclass
class Viewers:
    """The three viewers' sockets, on one event loop of their own."""

    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    sockets: dict[str, Socket]


@pytest.fixture(scope="module")
def world(services: Services) -> World:
    return World(services, "ws")


@pytest.fixture(scope="module")
def viewers(services: Services, world: World) -> Iterator[Viewers]:
    loop = asyncio.new_event_loop()
    base = services.table.base.replace("http", "ws", 1)
    url = f"{base}/v1/tables/{world.seated}/ws"

    async def start() -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    session = loop.run_until_complete(start())
    sockets = {
        "seated": Socket(session, f"{url}?token={world.tokens['ana']}"),
        "spectator": Socket(session, f"{url}?token={world.tokens['cid']}"),
        "anonymous": Socket(session, url),
    }
    try:
        yield Viewers(loop, session, sockets)
    finally:

        async def stop() -> None:
            for socket in sockets.values():
                await socket.close()
            await session.close()

        loop.run_until_complete(stop())
        loop.close()


@pytest.mark.parametrize("viewer", ["seated", "spectator", "anonymous"])
def test_every_frame_is_answered_and_changes_nothing(
    services: Services, world: World, viewers: Viewers, viewer: str
) -> None:
    max_bytes = services.settings.ws_max_frame_bytes
    before = world.table_state(world.seated)
    socket = viewers.sockets[viewer]

    @examples(FRAMES)
    @given(frame=frames(max_bytes))
    def check(frame: Frame) -> None:
        if viewer == "seated":
            frame = stale(frame, before[0], max_bytes)
        note(f"the frame: {frame!r}")
        CASES[f"ws frames ({viewer})"] += 1
        try:
            answer = viewers.loop.run_until_complete(socket.answer(frame))
        except NoAnswer as exc:
            exc.add_note(f"service output:\n{services.table.new_output()[-6000:]}")
            raise
        output = services.table.new_output()
        assert services.table.alive(), f"the table service died:\n{output[-6000:]}"
        if frame.expect_close is not None:
            ANSWERS[f"ws {viewer}"][f"close {answer.data}"] += 1
            assert answer.type == aiohttp.WSMsgType.CLOSE, (answer, output[-3000:])
            assert answer.data == frame.expect_close, (answer, answer.extra)
        else:
            assert answer.type == aiohttp.WSMsgType.TEXT, (answer, output[-3000:])
            message = json.loads(answer.data)
            assert message.get("kind") == "error", answer.data[:500]
            assert set(message) == {"kind", "error"}, answer.data[:500]
            ANSWERS[f"ws {viewer}"][str(message["error"].get("code"))] += 1
            assert_error_shape(400, json.dumps({"error": message["error"]}).encode())
        after = world.table_state(world.seated)
        assert after == before, f"the frame changed the table: {before} -> {after}"

    check()
