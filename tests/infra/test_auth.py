"""Tokens (issue 13, part 5): what a Verifier accepts, what it refuses, and that every refusal
is an AuthError; the Authorization header; the token settings a service refuses to start with.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from typing import Any

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.infra.auth import (
    MAX_TOKEN_CHARS,
    AuthError,
    Identity,
    UnsafeTokenSettings,
    Verifier,
    bearer,
    check_token_settings,
    mint,
)
from shared.infra.settings import DEFAULT_AUTH_SECRET, Settings

SECRET = "a-test-secret-of-more-than-32-bytes-for-hs256"
OTHER = "another-secret-of-more-than-32-bytes-for-hs256"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def signed(claims: dict[str, Any], secret: str = SECRET, **headers: Any) -> str:
    return jwt.encode(claims, secret, algorithm="HS256", headers=headers or None)


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    out: dict[str, Any] = {"sub": "ana-1", "name": "Ana", "iat": now, "exp": now + 600}
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


def refused(verifier: Verifier, token: str) -> str:
    with pytest.raises(AuthError) as error:
        verifier.verify(token)
    return str(error.value)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# --- what a token must carry ------------------------------------------------------------------


def test_a_good_token_is_its_identity_with_its_expiry() -> None:
    exp = int(time.time()) + 600
    identity = Verifier(SECRET).verify(signed(claims(exp=exp)))
    assert identity == Identity(id="ana-1", name="Ana", expires_at=float(exp))
    # Without a name, the subject names the player.
    assert Verifier(SECRET).verify(signed(claims(name=None))).name == "ana-1"
    assert Verifier(SECRET).verify(mint(SECRET, "bia", "Bia")).id == "bia"


def test_mint_always_sets_exp() -> None:
    token = mint(SECRET, "ana", "Ana", ttl_s=60)
    payload = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert payload["exp"] - payload["iat"] == 60


def test_exp_is_required() -> None:
    assert "'exp'" in refused(Verifier(SECRET), signed(claims(exp=None)))


@pytest.mark.parametrize("exp", ["soon", True, [1], {"at": 1}, float("inf")])
def test_exp_must_be_a_number(exp: Any) -> None:
    refused(Verifier(SECRET), signed(claims(exp=exp)))


EXTREMES = [10**400, -(10**400), 2**63, -(2**63) - 1, 2**1024, 1e308, -1e308, 0, -1]


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
@pytest.mark.parametrize("value", EXTREMES)
def test_numeric_claims_at_their_extremes_are_accepted_or_refused_never_an_error(
    claim: str, value: Any
) -> None:
    """A well-signed token whose exp, iat or nbf is any JSON number (an integer of 400
    digits, past a float's range, negative) is an identity or an AuthError (401): never
    another exception (a 500)."""
    token = signed(claims(**{claim: value}))
    try:
        identity = Verifier(SECRET).verify(token)
    except AuthError:
        return
    assert identity.expires_at is not None
    assert identity.expires_at > time.time()  # only a future expiry is ever accepted


def test_an_exp_of_400_digits_is_refused_as_not_a_number_of_seconds() -> None:
    assert "'exp' is not a number of seconds" in refused(
        Verifier(SECRET), signed(claims(exp=10**400))
    )


@pytest.mark.parametrize(
    "sub", [None, "", "   ", 7, ["ana"], "a\x00b", "a\nb", "x" * 257, "\ud800"]
)
def test_sub_is_required_and_a_short_printable_text(sub: Any) -> None:
    payload = claims(sub="placeholder")
    if sub is None:
        del payload["sub"]
    else:
        payload["sub"] = sub
    # A lone surrogate cannot be encoded by PyJWT; the site's JSON can still carry one.
    token = forged_payload(payload) if sub == "\ud800" else signed(payload)
    refused(Verifier(SECRET), token)


@pytest.mark.parametrize("name", [7, "a\x00b", "x" * 257, "\x1b[31mred"])
def test_a_name_that_is_no_printable_text_is_refused(name: Any) -> None:
    refused(Verifier(SECRET), signed(claims(name=name)))


def forged_payload(payload: dict[str, Any], secret: str = SECRET) -> str:
    """A well-signed token whose payload is exactly this JSON (surrogates escaped)."""
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(payload).encode())  # ensure_ascii: "\ud800" stays an escape
    signing = f"{head}.{body}".encode()
    algorithm = jwt.algorithms.HMACAlgorithm(jwt.algorithms.HMACAlgorithm.SHA256)
    signature = algorithm.sign(signing, algorithm.prepare_key(secret))
    return f"{head}.{body}.{b64(signature)}"


def test_the_wrong_secret_is_refused() -> None:
    assert "Signature" in refused(Verifier(SECRET), signed(claims(), secret=OTHER))


# --- leeway -------------------------------------------------------------------------------------


def test_a_token_expired_within_the_leeway_is_accepted() -> None:
    now = int(time.time())
    assert Verifier(SECRET).verify(signed(claims(exp=now - 10))).id == "ana-1"


def test_a_token_expired_past_the_leeway_is_refused() -> None:
    now = int(time.time())
    assert "expired" in refused(Verifier(SECRET), signed(claims(exp=now - 60)))
    # The leeway is the setting's.
    assert "expired" in refused(Verifier(SECRET, leeway_s=5), signed(claims(exp=now - 10)))
    strict = Verifier.from_settings(Settings(auth_secret=SECRET, auth_leeway_s=0))
    assert "expired" in refused(strict, signed(claims(exp=now - 1)))


def test_not_before_and_issued_at_get_the_leeway_too() -> None:
    now = int(time.time())
    assert Verifier(SECRET).verify(signed(claims(nbf=now + 10, iat=now + 10))).id == "ana-1"
    assert "not yet valid" in refused(Verifier(SECRET), signed(claims(nbf=now + 60)))
    refused(Verifier(SECRET), signed(claims(iat=now + 60)))


# --- issuer and audience ----------------------------------------------------------------------


def test_issuer_and_audience_are_ignored_when_unset() -> None:
    verifier = Verifier(SECRET)
    assert verifier.verify(signed(claims(iss="someone", aud="something"))).id == "ana-1"
    assert verifier.verify(signed(claims())).id == "ana-1"


def test_the_issuer_is_required_and_checked_when_set() -> None:
    verifier = Verifier.from_settings(Settings(auth_secret=SECRET, auth_issuer="selminha.com"))
    assert verifier.verify(signed(claims(iss="selminha.com"))).id == "ana-1"
    assert "'iss'" in refused(verifier, signed(claims()))
    assert "issuer" in refused(verifier, signed(claims(iss="evil.example")))


def test_the_audience_is_required_and_checked_when_set() -> None:
    verifier = Verifier.from_settings(Settings(auth_secret=SECRET, auth_audience="gin"))
    assert verifier.verify(signed(claims(aud="gin"))).id == "ana-1"
    assert verifier.verify(signed(claims(aud=["chess", "gin"]))).id == "ana-1"
    assert "'aud'" in refused(verifier, signed(claims()))
    assert "meant for" in refused(verifier, signed(claims(aud="chess")))
    assert "meant for" in refused(verifier, signed(claims(aud=["chess"])))


# --- algorithms ---------------------------------------------------------------------------------


def test_only_hs256_is_accepted() -> None:
    verifier = Verifier(SECRET)
    payload = claims()
    unsigned = jwt.encode(payload, None, algorithm="none")
    hs512 = jwt.encode(payload, SECRET + SECRET, algorithm="HS512")
    # An HS256 signature under a header that claims another algorithm (RS256's confusion).
    head = b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    _, body, signature = signed(payload).split(".")
    relabelled = f"{head}.{body}.{signature}"
    none_upper = f"{b64(json.dumps({'alg': 'NONE'}).encode())}.{body}."
    for token in (unsigned, hs512, relabelled, none_upper):
        assert "algorithm" in refused(verifier, token).lower(), token


# --- garbage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not-a-jwt",
        "a.b",
        "a.b.c.d",
        "....",
        "eyJ\udcff.eyJ.sig",  # a raw byte as aiohttp hands it on (surrogateescape)
        "eyJé.eyJ.sig",
        "ééé",
        "a\x00b.c.d",
        "a.b.c\n",
        " a.b.c",
        "a.b.c\x7f",
        "x" * (MAX_TOKEN_CHARS + 1),
        "a" * MAX_TOKEN_CHARS + ".b.c",
        "e30.e30.",  # {} and {}
        "W10.W10.c2ln",  # [] and []
        "bnVsbA.bnVsbA.c2ln",  # null and null
    ],
)
def test_garbage_is_an_auth_error(token: str) -> None:
    refused(Verifier(SECRET), token)


def test_a_good_token_with_a_byte_more_is_refused() -> None:
    good = signed(claims())
    for token in (good + "\udcff", good + "é", "\udcff" + good, good + "\x00", good + "="):
        refused(Verifier(SECRET), token)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | st.from_regex(r"[A-Za-z0-9_\-]{0,30}(\.[A-Za-z0-9_\-=]{0,30}){2}"))
def test_any_text_is_an_identity_or_an_auth_error(token: str) -> None:
    with contextlib.suppress(AuthError):
        Verifier(SECRET).verify(token)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities: Python's JSON writes and reads them
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
CLAIM_NAMES = st.sampled_from(["sub", "name", "exp", "iat", "nbf", "iss", "aud", "jti"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(CLAIM_NAMES, JSON), st.booleans())
def test_any_well_signed_claims_are_an_identity_or_an_auth_error(
    payload: dict[str, Any], with_issuer: bool
) -> None:
    """Only the site can sign; still, whatever it signs gives an answer, never a crash."""
    verifier = Verifier(
        SECRET, issuer="i" if with_issuer else "", audience="a" if with_issuer else ""
    )
    try:
        identity = verifier.verify(forged_payload(payload))
    except AuthError:
        return
    assert isinstance(identity.id, str)
    assert identity.expires_at is not None


# --- the cache ----------------------------------------------------------------------------------


def test_the_cache_lets_no_expired_token_through() -> None:
    clock = Clock()
    verifier = Verifier(SECRET, clock=clock)
    token = signed(claims(exp=int(clock.now) + 5))
    assert verifier.verify(token).id == "ana-1"  # remembered from now on
    clock.now += 30  # expired 25 s ago: within the leeway
    assert verifier.verify(token).id == "ana-1"
    clock.now += 10  # 35 s ago: past it
    assert "expired" in refused(verifier, token)
    assert "expired" in refused(Verifier(SECRET, clock=clock), token)


def test_the_cache_is_keyed_by_the_verifiers_parameters() -> None:
    token = signed(claims(iss="selminha.com", aud="gin"))
    assert Verifier(SECRET).verify(token).id == "ana-1"  # remembered for this secret...
    refused(Verifier(OTHER), token)  # ...not for another
    refused(Verifier(SECRET, issuer="other.example"), token)
    refused(Verifier(SECRET, audience="chess"), token)
    assert Verifier(SECRET, issuer="selminha.com", audience="gin").verify(token).id == "ana-1"
    now = int(time.time())
    late = signed(claims(exp=now - 20))
    assert Verifier(SECRET).verify(late).id == "ana-1"
    refused(Verifier(SECRET, leeway_s=10), late)


def test_a_verifier_does_not_show_its_secret() -> None:
    assert SECRET not in repr(Verifier(SECRET))
    assert SECRET not in repr(Verifier.from_settings(Settings(auth_secret=SECRET)))


# --- the Authorization header -----------------------------------------------------------------


def test_bearer_gives_the_token_or_none() -> None:
    assert bearer(None) is None
    assert bearer("") is None
    assert bearer("Bearer abc.def.ghi") == "abc.def.ghi"
    assert bearer("bearer abc.def.ghi") == "abc.def.ghi"  # schemes are case-insensitive
    assert bearer("BEARER   abc.def.ghi ") == "abc.def.ghi"  # RFC 6750: 1*SP


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer ",
        "Bearer    ",
        "   ",
        "Token abc.def.ghi",
        "Basic YWxhZGRpbjpvcGVuc2VzYW1l",
        "abc.def.ghi",
        "Bearer abc def",
        "Bearer\tabc.def.ghi",
        "Bearer abc.def.ghi\x00",
        "Bearer \x00",
        "Bearer abc\udcff.def.ghi",  # a raw byte 0xff, as aiohttp decodes it
        "Bearer é.def.ghi",
        "B\udce9arer abc.def.ghi",
        "Bearer abc.def.ghi\r\n",
    ],
)
def test_bearer_refuses_a_malformed_header(header: str) -> None:
    with pytest.raises(AuthError) as error:
        bearer(header)
    message = str(error.value)
    assert "Authorization" in message
    assert message.isascii()
    assert message.isprintable()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=100))
def test_bearer_of_any_text_is_a_token_none_or_an_auth_error(header: str) -> None:
    try:
        token = bearer(header)
    except AuthError:
        return
    assert token is None or (token.isascii() and token.isprintable() and " " not in token)


# --- the settings a service refuses to start with ---------------------------------------------


def unsafe(**changes: Any) -> str:
    with pytest.raises(UnsafeTokenSettings) as error:
        check_token_settings(Settings(**changes))
    return str(error.value)


def test_the_default_secret_is_refused_without_dev_tokens() -> None:
    assert "GIN_AUTH_SECRET is the public default" in unsafe(dev_tokens=False)
    assert DEFAULT_AUTH_SECRET not in unsafe(dev_tokens=False)


def test_a_short_secret_is_refused_without_dev_tokens() -> None:
    assert "31 bytes" in unsafe(auth_secret="s" * 31)
    assert "31 bytes" in unsafe(auth_secret="é" * 15 + "s")  # bytes, not characters
    assert "0 bytes" in unsafe(auth_secret="")
    assert "UTF-8" in unsafe(auth_secret="s" * 40 + "\udcff")  # a raw byte in the environment


def test_dev_tokens_are_refused_over_https() -> None:
    for url in ("https://selminha.com", "HTTPS://selminha.com", " https://x"):
        message = unsafe(dev_tokens=True, public_url=url)
        assert "GIN_DEV_TOKENS" in message
        assert "GIN_PUBLIC_URL" in message
    # ...even with a good secret.
    assert "https" in unsafe(dev_tokens=True, auth_secret=SECRET, public_url="https://x")


def test_a_negative_leeway_is_refused() -> None:
    assert "GIN_AUTH_LEEWAY_S" in unsafe(auth_secret=SECRET, auth_leeway_s=-1)
    assert "GIN_AUTH_LEEWAY_S" in unsafe(auth_secret=SECRET, auth_leeway_s=float("nan"))


@pytest.mark.parametrize(
    "changes",
    [
        {"auth_secret": "s" * 32},
        {"auth_secret": SECRET, "public_url": "https://selminha.com"},
        {"auth_secret": SECRET, "auth_issuer": "selminha.com", "auth_audience": "gin"},
        {"dev_tokens": True},  # development: the default secret is fine
        {"dev_tokens": True, "auth_secret": "short"},
        {"dev_tokens": True, "public_url": "http://localhost:8080"},
        {"auth_secret": SECRET, "auth_leeway_s": 0},
    ],
)
def test_safe_token_settings_are_accepted(changes: dict[str, Any]) -> None:
    check_token_settings(Settings(**changes))


def test_the_settings_from_the_environment_are_checked_the_same() -> None:
    env = {"GIN_AUTH_SECRET": SECRET, "GIN_DEV_TOKENS": "false"}
    check_token_settings(Settings.from_env(env))
    with pytest.raises(UnsafeTokenSettings):
        check_token_settings(Settings.from_env({"GIN_DEV_TOKENS": "false"}))
