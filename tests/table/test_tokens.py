"""The Authorization header as a hostile client sends it (issue 13, part 5): raw bytes,
non-ASCII, control characters and oversized tokens answer 401 in the one error shape, never
a 500; the bytes go out on a socket of our own (aiohttp's client refuses to send them)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import jwt
import msgspec
import pytest

from tests.table.conftest import Api, assert_error


async def raw_request(
    api: Api | Any, method: str, target: bytes, headers: list[bytes], body: bytes = b""
) -> tuple[int, Any]:
    """Send exactly these bytes as an HTTP/1.1 request to ``api.client``'s server; (status,
    decoded JSON body or text; None for a 101)."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        head = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: test", *headers]
        head.append(b"Content-Length: " + str(len(body)).encode())
        if not any(h.lower().startswith(b"connection:") for h in headers):
            head.append(b"Connection: close")
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await writer.drain()
        fields = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
        status = int(fields.split(b"\r\n", 1)[0].split()[1])
        if status == 101:
            return status, None
        lines = [line.lower() for line in fields.split(b"\r\n")]
        length = [int(x.partition(b":")[2]) for x in lines if x.startswith(b"content-length:")]
        if length:
            payload = await asyncio.wait_for(reader.readexactly(length[0]), timeout=30)
        else:
            payload = await asyncio.wait_for(reader.read(), timeout=30)
            if b"transfer-encoding: chunked" in lines:
                payload = _unchunked(payload)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    try:
        return status, msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return status, payload.decode(errors="replace")


def _unchunked(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


# The header values a hostile client sends; each reaches the service as text with surrogates
# (raw bytes) or non-ASCII characters.
def hostile_values(good: bytes) -> list[bytes]:
    return [
        b"Bearer \xff",  # a raw byte
        b"Bearer \xff\xfe\xfd.\x80.\x81",
        b"Bearer " + good + b"\xff",  # a good token with a raw byte after it
        b"Bearer \xc3\xa9" + good,  # UTF-8 'é' before it
        b"Bearer " + good.replace(b".", b"\xe9", 1),  # Latin-1 'é' inside it
        b"B\xe9arer " + good,  # in the scheme
        b"\xff",
        b"Bearer " + b"e" * 6000,  # absurdly long
        b"Bearer " + good + b" " + good,
    ]


@pytest.mark.parametrize("case", range(len(hostile_values(b"x"))))
async def test_a_raw_byte_or_non_ascii_in_the_bearer_token_is_401(api: Api, case: int) -> None:
    good = api.token("Ana").encode()
    table_id, _, _ = await api.table_for_two()
    value = hostile_values(good)[case]
    for method, target, body in (
        ("GET", b"/v1/players/me/preferences", b""),
        ("POST", b"/v1/tables", b"{}"),
        ("POST", f"/v1/tables/{table_id}/commands".encode(), b'{"type": "pass_upcard"}'),
        ("GET", f"/v1/tables/{table_id}".encode(), b""),  # a token is optional there: not a bad one
    ):
        status, error = await raw_request(api, method, target, [b"Authorization: " + value], body)
        assert_error(status, error, 401, "unauthorized", None)
        assert "Authorization" in error["error"]["message"] or "token" in error["error"]["message"]
    # Nothing above sat anyone down or moved: the good token still works, the table unchanged.
    status, view = await raw_request(
        api, "GET", f"/v1/tables/{table_id}".encode(), [b"Authorization: Bearer " + good]
    )
    assert status == 200, view
    assert view["you"] is None


UPGRADE = [
    b"Upgrade: websocket",
    b"Connection: Upgrade",
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    b"Sec-WebSocket-Version: 13",
]


async def test_a_raw_byte_in_the_query_token_is_401(api: Api) -> None:
    """The WebSocket route's ``?token=``, percent-encoded bytes in it: 401, no socket."""
    table_id, _, _ = await api.table_for_two()
    path = f"/v1/tables/{table_id}/ws".encode()
    for token in (b"%FF", b"%C3%A9", b"%00", b"a.b.c%FF", b"%ZZ", b"%0D%0A"):
        status, error = await raw_request(api, "GET", path + b"?token=" + token, UPGRADE)
        assert_error(status, error, 401, "unauthorized", None)
    # A raw byte in the URL itself never reaches the service: aiohttp answers 400.
    status, _ = await raw_request(api, "GET", path + b"?token=\xff", UPGRADE)
    assert status == 400
    # A bad header on the WebSocket route is as bad as anywhere.
    status, error = await raw_request(api, "GET", path, [b"Authorization: Bearer \xff", *UPGRADE])
    assert_error(status, error, 401, "unauthorized", None)


async def test_control_characters_in_the_header_are_refused_never_a_500(api: Api) -> None:
    """aiohttp's own parser refuses some bytes (400) before the service sees the request;
    the rest reach the service, which answers 401."""
    good = api.token("Ana").encode()
    for value in (b"Bearer \x01" + good, b"Bearer " + good + b"\x7f", b"Bearer \x1b[31m"):
        status, error = await raw_request(
            api, "GET", b"/v1/players/me/preferences", [b"Authorization: " + value]
        )
        if status == 401:
            assert_error(status, error, 401, "unauthorized", None)
        else:
            assert status == 400, (value, status, error)


async def test_a_signed_token_with_an_exp_of_400_digits_is_401_on_http_and_the_socket(
    api: Api,
) -> None:
    """A correctly signed token whose ``exp`` no float can hold: 401 on a route and on the
    socket route, never a 500 (issue 31)."""
    table_id, _, _ = await api.table_for_two()
    claims = {"sub": "ana-400", "name": "Ana", "exp": 10**400}
    token = jwt.encode(claims, api.settings.auth_secret, algorithm="HS256")
    header = b"Authorization: Bearer " + token.encode()
    status, error = await raw_request(api, "GET", f"/v1/tables/{table_id}".encode(), [header])
    assert_error(status, error, 401, "unauthorized", None)
    path = f"/v1/tables/{table_id}/ws?token={token}".encode()
    status, error = await raw_request(api, "GET", path, UPGRADE)
    assert_error(status, error, 401, "unauthorized", None)
