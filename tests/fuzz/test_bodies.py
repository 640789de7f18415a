"""Hostile request bodies and raw requests: what the document's schemas never make.

schemathesis builds bodies from the schemas; a hostile client does not. Every operation that
reads a body gets hypothesis-made bytes: JSON nested deeper than a recursive decoder goes,
bodies past ``max_body_bytes`` (413), bytes that are not UTF-8, numbers no column holds.
Every answer must be a 4xx of the one error shape (or a 2xx, where the bytes happen to make
a valid request), and a refusal leaves the seated table as it was.

Requests that aiohttp's own parser refuses (a header past 8190 bytes, a NUL in a header) never
reach a route, so they cannot get the error body; they must still get a 4xx, and the service
must go on answering.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, note
from hypothesis import strategies as st

from tests.fuzz.conftest import Services, World, assert_error_shape, examples
from tests.fuzz.tally import CASES

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
BODIES = int(os.environ.get("GIN_FUZZ_BODIES", "60"))
# The fields of every request body (a decoder may descend into a known one first).
# Shallow, or far past the interpreter's recursion limit (1000): never near it, where the
# outcome would hang on the stack the server happens to be at.
DEPTHS = st.integers(min_value=1, max_value=300) | st.integers(min_value=1500, max_value=6000)
KEYS = ["type", "options", "invite_code", "level", "text", "deck_design", "name", "sub", "a"]


def body_operations() -> list[tuple[str, str, str]]:
    """(service tag, method, path) of every operation of the document that reads a body."""
    doc = yaml.safe_load(DOCUMENT.read_text())
    found = []
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if isinstance(operation, dict) and "requestBody" in operation:
                found.append((operation["tags"][0], method.upper(), path))
    return found


def nested(depth: int, shape: str) -> bytes:
    """JSON ``depth`` levels deep."""
    if shape == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def bodies(max_bytes: int) -> st.SearchStrategy[tuple[bytes, bool]]:
    """A body, and whether it is too large (owed a 413)."""
    deep = st.builds(
        lambda key, depth, shape: (
            b'{"' + key.encode() + b'":' + nested(depth, shape) + b"}",
            False,
        ),
        st.sampled_from(KEYS),
        DEPTHS,
        st.sampled_from(["array", "object"]),
    )
    deep_top = st.builds(
        lambda depth, shape: (nested(depth, shape), False),
        DEPTHS,
        st.sampled_from(["array", "object"]),
    )
    too_large = st.builds(
        lambda key, size: (b'{"' + key.encode() + b'":"' + b"x" * size + b'"}', True),
        st.sampled_from(KEYS),
        st.integers(min_value=max_bytes, max_value=4 * max_bytes),
    )
    not_utf8 = st.builds(
        lambda key, bad: (b'{"' + key.encode() + b'":"' + bad + b'"}', False),
        st.sampled_from(KEYS),
        st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\x00"]),
    )
    numbers = st.builds(
        lambda key, number: (b'{"' + key.encode() + b'":' + number.encode() + b"}", False),
        st.sampled_from([*KEYS, "expected_version", "deadwood"]),
        st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", str(2**64), str(-(2**63) - 1)])
        | st.integers().map(str),
    )
    raw = st.builds(lambda b: (b, False), st.binary(max_size=300))
    return st.one_of(deep, deep_top, too_large, not_utf8, numbers, raw)


@pytest.fixture(scope="module")
def world(services: Services) -> World:
    return World(services, "bodies")


@pytest.mark.parametrize(
    ("service", "method", "path"), body_operations(), ids=lambda v: str(v).replace("/", "_")
)
def test_hostile_bodies_are_refused_clearly(
    services: Services, world: World, service: str, method: str, path: str
) -> None:
    base = services.chat.base if service == "chat" else services.table.base
    url = base + path.replace("{id}", world.seated)
    max_bytes = services.settings.max_body_bytes
    before = world.state(world.seated)

    @examples(BODIES)
    @given(body=bodies(max_bytes))
    def check(body: tuple[bytes, bool]) -> None:
        data, too_large = body
        note(f"the body: {len(data)} bytes, {data[:200]!r}...")
        CASES["http hostile bodies"] += 1
        response = world.http.request(
            method,
            url,
            data=data,
            headers={**world.header("ana"), "Content-Type": "application/json"},
            timeout=30,
        )
        output = services.table.new_output() + services.chat.new_output()
        status = response.status_code
        assert status < 500, f"{status} {response.text[:300]}\nservice output:\n{output[-6000:]}"
        if too_large:
            assert status == 413, f"{len(data)} bytes: {status} {response.text[:300]}"
        if status >= 400:
            assert_error_shape(status, response.content)
            after = world.state(world.seated)
            assert after == before, f"a refused body changed the table: {before} -> {after}"

    check()


async def raw_request(port: int, request: bytes) -> bytes:
    """Send bytes as they are; the status line and headers of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
        await writer.wait_closed()


RAW = {
    "a header past 8190 bytes": b"GET /v1/tables/abc HTTP/1.1\r\nHost: x\r\n"
    b"Authorization: Bearer " + b"a" * 9000 + b"\r\n\r\n",
    "a NUL in a header": b"GET /v1/tables/abc HTTP/1.1\r\nHost: x\r\n"
    b"Authorization: Bearer a\x00b\r\n\r\n",
    "a raw byte in the path": b"GET /v1/tables/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    "a NUL in the path": b"GET /v1/tables/a\x00b HTTP/1.1\r\nHost: x\r\n\r\n",
    "a length no body has": b"POST /v1/tables HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 99999999999999999999999\r\n\r\n{}",
    "two lengths": b"POST /v1/tables HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
}


@pytest.mark.parametrize("what", list(RAW))
def test_requests_the_parser_refuses_get_a_4xx_and_the_service_goes_on(
    services: Services, what: str
) -> None:
    CASES["http raw requests"] += 1
    port = services.table.service.port
    head = asyncio.run(raw_request(port, RAW[what]))
    status = int(head.split(b" ", 2)[1])
    assert 400 <= status < 500, head.decode(errors="replace")
    alive = asyncio.run(raw_request(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert alive.startswith(b"HTTP/1.1 200"), alive
