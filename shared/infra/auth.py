"""Identity: HS256 bearer tokens signed by the site, with ``sub``, ``name`` and ``exp``
(docs/DESIGN.md 4).

A service builds one ``Verifier`` from its settings and asks it about every token; the
settings themselves are checked before the service starts (``check_token_settings``).
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable

import jwt
import msgspec

from shared.infra.settings import DEFAULT_AUTH_SECRET, Settings, env_name

ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32  # RFC 7518 3.2: an HS256 key at least as long as its hash
MAX_TOKEN_CHARS = 4096  # a site's token is a few hundred; anything this long is not one
MAX_CLAIM_CHARS = 256  # ``sub`` and ``name`` are stored and shown: bounded, printable
# A JWS in compact form: three base64url parts, unpadded. Checked before PyJWT sees the
# token, so raw bytes, non-ASCII and control characters (which PyJWT meets as a
# UnicodeEncodeError, a 500) are refused here, in one place.
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*")  # RFC 7515 7.1
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # controls, lone surrogates


class Identity(msgspec.Struct, frozen=True):
    """Who sends a request; ``expires_at`` is the token's ``exp`` (unix seconds)."""

    id: str
    name: str
    expires_at: float | None = None


class AuthError(Exception):
    """A missing, malformed, wrongly signed or expired token."""


class UnsafeTokenSettings(Exception):
    """Settings a service that verifies tokens must not start with."""


def mint(secret: str, sub: str, name: str, ttl_s: float = 30 * 86400.0) -> str:
    """A signed token that expires ``ttl_s`` from now (the development route and tests use
    it; the site signs its own)."""
    now = int(time.time())
    payload = {"sub": sub, "name": name, "iat": now, "exp": now + int(ttl_s)}
    return jwt.encode(payload, secret, algorithm=ALGORITHM)


class Verifier:
    """Checks tokens as the settings say: HS256 only, ``exp`` and ``sub`` required, the
    issuer and audience when set, ``leeway_s`` of clock skew.

    A player sends the same token with every move: a token's signature is checked once and
    its identity remembered (by token and by these parameters); its expiry is checked on
    every call, against ``clock``.
    """

    __slots__ = ("_clock", "_key")

    def __init__(
        self,
        secret: str,
        *,
        issuer: str = "",
        audience: str = "",
        leeway_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = _Key(secret, issuer, audience, leeway_s)
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: Settings) -> Verifier:
        """The verifier of a service's settings (``auth_*``)."""
        return cls(
            settings.auth_secret,
            issuer=settings.auth_issuer,
            audience=settings.auth_audience,
            leeway_s=settings.auth_leeway_s,
        )

    def __repr__(self) -> str:  # never the secret
        return f"Verifier(issuer={self._key.issuer!r}, audience={self._key.audience!r})"

    def verify(self, token: str) -> Identity:
        """The identity a token carries, or AuthError (never another exception)."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise AuthError(f"the token is not valid: longer than {MAX_TOKEN_CHARS} characters")
        if not _COMPACT_JWS.fullmatch(token):
            raise AuthError(
                "the token is not valid: a token is three unpadded base64url parts joined by "
                "'.' (letters, digits, '-', '_')"
            )
        identity = _verified(self._key, token)
        assert identity.expires_at is not None  # exp is required
        if identity.expires_at + self._key.leeway_s <= self._clock():
            raise AuthError("the token has expired")
        return identity


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None without the header.

    The header arrives as aiohttp decoded it (raw bytes as surrogates): anything but
    printable ASCII is an AuthError, as is another scheme or a missing token.
    """
    if header is None or header == "":
        return None
    if not header.isascii() or not header.isprintable():
        raise AuthError(
            "the Authorization header has characters a token never has (only printable ASCII)"
        )
    scheme, _, token = header.strip().partition(" ")
    token = token.strip(" ")  # RFC 6750: one or more spaces after the scheme
    if scheme.lower() != "bearer" or not token:
        raise AuthError("use the header 'Authorization: Bearer <token>'")
    if " " in token:
        raise AuthError("the Authorization header has spaces inside its token")
    return token


def check_token_settings(settings: Settings) -> None:
    """Raise UnsafeTokenSettings when a service must not verify tokens with these settings:
    the public default secret, or one under 32 bytes, unless development tokens are on;
    development tokens when the public URL is https."""
    secret = env_name("auth_secret")
    dev = env_name("dev_tokens")
    try:
        size = len(settings.auth_secret.encode("utf-8"))
    except UnicodeEncodeError:
        raise UnsafeTokenSettings(f"{secret} is not UTF-8 text") from None
    if not settings.dev_tokens:
        if settings.auth_secret == DEFAULT_AUTH_SECRET:
            raise UnsafeTokenSettings(
                f"{secret} is the public default: set the key the site signs tokens with "
                f"(or {dev}=true for development)"
            )
        if size < MIN_SECRET_BYTES:
            raise UnsafeTokenSettings(
                f"{secret} has {size} bytes, fewer than {MIN_SECRET_BYTES} "
                f"(or {dev}=true for development)"
            )
    if settings.dev_tokens and settings.public_url.strip().lower().startswith("https:"):
        raise UnsafeTokenSettings(
            f"{dev} is on while {env_name('public_url')} is https: development tokens let "
            "anyone be anyone, never in production"
        )
    if not (math.isfinite(settings.auth_leeway_s) and settings.auth_leeway_s >= 0):
        raise UnsafeTokenSettings(f"{env_name('auth_leeway_s')} must be zero or more seconds")


class _Key(msgspec.Struct, frozen=True):
    """What a verification depends on besides the token: the cache's key with it."""

    secret: str
    issuer: str
    audience: str
    leeway_s: float


@functools.lru_cache(maxsize=20_000)
def _verified(key: _Key, token: str) -> Identity:
    """The identity of a well-signed token (its expiry is the caller's to check); only
    accepted tokens are remembered, so a refused one is checked again each time."""
    required = ["exp", "sub"] + (["iss"] if key.issuer else []) + (["aud"] if key.audience else [])
    try:
        claims = jwt.decode(
            token,
            key.secret,
            algorithms=[ALGORITHM],
            issuer=key.issuer or None,
            audience=key.audience or None,
            leeway=key.leeway_s,
            # exp is checked by the Verifier on every call, with its clock; an ``aud`` is
            # ignored while no audience is set.
            options={"require": required, "verify_exp": False, "verify_aud": bool(key.audience)},
        )
    except jwt.MissingRequiredClaimError as exc:
        raise AuthError(f"the token is not valid: it has no '{exc.claim}' claim") from exc
    except jwt.InvalidIssuerError as exc:
        raise AuthError("the token is not valid: it is not from this site's issuer") from exc
    except jwt.InvalidAudienceError as exc:
        raise AuthError("the token is not valid: it is not meant for this site") from exc
    except jwt.InvalidAlgorithmError as exc:
        raise AuthError(f"the token is not valid: its algorithm is not {ALGORITHM}") from exc
    except jwt.PyJWTError as exc:
        raise AuthError(f"the token is not valid: {exc}") from exc
    except (ValueError, TypeError, OverflowError) as exc:  # claims PyJWT fails to read
        raise AuthError("the token is not valid: a claim has the wrong type") from exc
    expires_at = _seconds(claims["exp"])
    if expires_at is None:
        raise AuthError("the token is not valid: 'exp' is not a number of seconds")
    sub = claims["sub"]
    if not _printable(sub):
        raise AuthError("the token is not valid: its subject is not a short printable text")
    name = claims.get("name")
    if name is not None and name != "" and not _printable(name):
        raise AuthError("the token is not valid: its name is not a short printable text")
    return Identity(id=sub, name=name or sub, expires_at=expires_at)


def _seconds(value: object) -> float | None:
    """A claim's number of seconds as a finite float; None for anything else (a boolean, a
    text, an infinity, or an integer too large for a float: JSON numbers have no bound)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


def _printable(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_CLAIM_CHARS
        and value.strip() != ""
        and not _UNPRINTABLE.search(value)
    )
