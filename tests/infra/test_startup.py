"""The services that verify tokens refuse to start with unsafe token settings (issue 13, part
5): ``python -m services.table`` and ``services.chat`` exit 1 with one line, before they open
anything; the migrations, which verify no tokens, are not refused."""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest

from shared.infra.auth import UnsafeTokenSettings, check_token_settings
from shared.infra.settings import Settings
from tests.e2e.processes import ROOT, Service, free_port

GOOD_SECRET = "a-production-like-secret-of-at-least-32-bytes"
# Nothing listens there: a service that got past the check would fail on these, differently.
NOWHERE = {
    "GIN_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/postgres",
    "GIN_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/",
}


def run(module: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m <module>`` with only these GIN_* variables (none of the test run's)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GIN_")}
    clean.update(NOWHERE, GIN_HTTP_PORT=str(free_port()), GIN_LOG_FORMAT="console", **env)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=clean,
        cwd=ROOT,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
    )


def refusal(env: dict[str, str]) -> str:
    """The message check_token_settings gives for these variables."""
    with pytest.raises(UnsafeTokenSettings) as error:
        check_token_settings(Settings.from_env(env))
    return str(error.value)


REFUSED = [
    ({}, "GIN_AUTH_SECRET is the public default"),
    ({"GIN_DEV_TOKENS": "false"}, "GIN_AUTH_SECRET is the public default"),
    ({"GIN_AUTH_SECRET": "s" * 31}, "31 bytes, fewer than 32"),
    ({"GIN_AUTH_SECRET": "s" * 40 + "\udcff"}, "not UTF-8"),  # a raw byte in the Secret
    (
        {"GIN_DEV_TOKENS": "true", "GIN_PUBLIC_URL": "https://selminha.com"},
        "GIN_DEV_TOKENS is on while GIN_PUBLIC_URL is https",
    ),
    (
        {
            "GIN_DEV_TOKENS": "true",
            "GIN_AUTH_SECRET": GOOD_SECRET,
            "GIN_PUBLIC_URL": "https://selminha.com",
        },
        "GIN_DEV_TOKENS is on while GIN_PUBLIC_URL is https",
    ),
]


@pytest.mark.parametrize("module", ["services.table", "services.chat"])
@pytest.mark.parametrize(("env", "expected"), REFUSED)
def test_a_service_that_verifies_tokens_refuses_unsafe_settings(
    module: str, env: dict[str, str], expected: str
) -> None:
    done = run(module, env)
    assert done.returncode == 1, done
    assert done.stderr.splitlines() == [f"refusing to start: {refusal(env)}"], done.stderr
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_the_migrations_are_not_refused(settings: Settings) -> None:
    """The migrations Job is given no secret (least privilege): it must still run."""
    done = run("services.table", {"GIN_DATABASE_URL": settings.database_url}, "migrate")
    assert done.returncode == 0, done.stderr


async def test_safe_production_settings_start(settings: Settings) -> None:
    """A real secret without development tokens, over https: the service starts and serves."""
    production = msgspec.structs.replace(
        settings, dev_tokens=False, auth_secret=GOOD_SECRET, public_url="https://selminha.com"
    )
    service = Service("services.table", production)
    try:
        await service.ready()
    finally:
        service.stop()
    assert service.proc.returncode == 0
