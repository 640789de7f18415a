"""Identity: HS256 bearer tokens signed by the site, with ``sub`` and ``name`` (DESIGN.md 4)."""

from __future__ import annotations

import functools
import time

import jwt
import msgspec


class Identity(msgspec.Struct, frozen=True):
    """Who sends a request."""

    id: str
    name: str


class AuthError(Exception):
    """A missing, malformed, wrongly signed or expired token."""


def mint(secret: str, sub: str, name: str, ttl_s: float = 30 * 86400.0) -> str:
    """A signed token (the development route and tests use it; the site signs its own)."""
    now = int(time.time())
    payload = {"sub": sub, "name": name, "iat": now, "exp": now + int(ttl_s)}
    return jwt.encode(payload, secret, algorithm="HS256")


def verify(secret: str, token: str) -> Identity:
    """The identity a token carries, or AuthError.

    A player sends the same token with every move: a verified token is remembered until it
    expires, so the signature is checked once, not on every request.
    """
    identity, expires = _verified(secret, token)
    if expires is not None and expires <= time.time():
        raise AuthError("the token has expired")
    return identity


@functools.lru_cache(maxsize=20_000)
def _verified(secret: str, token: str) -> tuple[Identity, float | None]:
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"], options={"require": ["sub"]})
    except jwt.ExpiredSignatureError as exc:
        raise AuthError("the token has expired") from exc
    except jwt.PyJWTError as exc:
        raise AuthError(f"the token is not valid: {exc}") from exc
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise AuthError("the token has no subject")
    name = claims.get("name")
    exp = claims.get("exp")
    identity = Identity(id=sub, name=name if isinstance(name, str) and name else sub)
    return identity, float(exp) if isinstance(exp, int | float) else None


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, if any."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("use the header 'Authorization: Bearer <token>'")
    return token.strip()
