"""The image (issue 27, item 9): the Dockerfile built on this machine and run as the pods run it.

``scripts/image.py`` builds it, as ``make image`` does, with Debian's buildah on a base made
from Debian's packages (no registry of images is reached; the layer cache makes a build of an
unchanged tree take seconds). From the image, as uid 10001 on a read-only root filesystem with
the host's network: the table, chat and timers services' migrations on a database of their
own, then the table service, whose ``/readyz`` answers 200 with PostgreSQL and RabbitMQ
reached, and which ends with status 0 on ``podman stop`` (SIGTERM). Without buildah, podman or
mmdebstrap (``make image-tools`` installs them, as ``make test`` does), not as root, without
its base (made from Debian's mirror) or on a machine where buildah's steps or podman's
containers cannot run, it skips and says why; a Dockerfile that does not build fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from shared.infra.settings import Settings
from tests.conftest import settings_of_their_own
from tests.e2e.processes import ROOT, free_port

sys.path.insert(0, str(ROOT / "scripts"))
import image

# A first build on a fresh machine makes the base (some 20 to 70 s of Debian's packages) and
# downloads the locked dependencies; later ones take their layers from the cache.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TAG = "localhost/gin:test"
MIGRATING = ("services.table", "services.chat", "services.timers")
READY_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def image_id() -> str:
    """The image of this tree, built now (its id: another run may move the tag meanwhile)."""
    missing = image.missing_tools()
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: make image-tools installs Debian's packages "
            "(make test runs it; see .run/image-tools.log for why it could not)"
        )
    if os.geteuid() != 0:
        pytest.skip("the image is built as root here (mmdebstrap, buildah), and this is not root")
    # What the machine cannot do skips, saying why: no base (Debian's mirror unreachable, say)
    # or no container; a Dockerfile that does not build fails.
    try:
        image.ensure_base()
    except image.ImageError as error:
        pytest.skip(f"no base image: {error}")
    reason = image.cannot_run()
    if reason:
        pytest.skip(reason)
    return image.build(TAG)


@pytest.fixture
def own(settings: Settings) -> Iterator[Settings]:
    """A database and a broker prefix for the image's services alone."""
    with settings_of_their_own(settings, "image") as own:
        yield own


def environment(settings: Settings, **more: str) -> list[str]:
    """``podman run``'s ``--env`` options: what the deployment sets, for these servers."""
    values = {
        "GIN_DATABASE_URL": settings.database_url,
        "GIN_AMQP_URL": settings.amqp_url,
        "GIN_PREFIX": settings.prefix,
        # Not the public development secret: the service refuses it without dev tokens.
        "GIN_AUTH_SECRET": secrets.token_hex(32),
        **more,
    }
    return [f"--env={name}={value}" for name, value in values.items()]


def test_the_image_runs_as_uid_10001_with_python_m_as_its_entrypoint(image_id: str) -> None:
    found = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Config}}", image_id],
        capture_output=True,
        text=True,
        check=True,
    )
    config = json.loads(found.stdout)
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["python", "-m"]
    assert config["Cmd"] == ["services.table"]


def test_the_image_migrates_and_the_table_service_is_ready(
    image_id: str, own: Settings, tmp_path: Path
) -> None:
    common = ["--rm", "--network=host", "--read-only", *environment(own)]
    for service in MIGRATING:
        migrated = subprocess.run(
            image.run_command([*common, image_id, service, "migrate"]),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert "migration_applied" in migrated.stdout, migrated.stdout + migrated.stderr
    assert {"gin_table", "gin_chat", "gin_timers"} <= asyncio.run(schemas(own.database_url))

    port = free_port()
    name = f"gin-image-test-{secrets.token_hex(4)}"
    log = tmp_path / "table.log"
    serve = image.run_command([*common, f"--name={name}", f"--env=GIN_HTTP_PORT={port}", image_id])
    with log.open("wb") as out:
        table = subprocess.Popen(serve, stdout=out, stderr=subprocess.STDOUT)
    try:
        status, body = ready(f"http://127.0.0.1:{port}/readyz", table)
        assert status == 200, f"{status} {body}\n{log.read_text()}"
        assert json.loads(body)["status"] == "ready", body
        subprocess.run(["podman", "stop", "--time=20", name], capture_output=True, check=True)
        assert table.wait(timeout=30) == 0, log.read_text()
    finally:
        if table.poll() is None:
            subprocess.run(["podman", "rm", "--force", "--time=0", name], capture_output=True)
            table.wait(timeout=30)


async def schemas(database_url: str) -> set[str]:
    """The database's schemas."""
    conn = await asyncpg.connect(database_url)
    try:
        return {row["nspname"] for row in await conn.fetch("SELECT nspname FROM pg_namespace")}
    finally:
        await conn.close()


def ready(url: str, process: subprocess.Popen[bytes]) -> tuple[int, str]:
    """``url``'s status and body once it answers 200, or the last answer after a while."""
    deadline = time.monotonic() + READY_WITHIN_S
    status, body = 0, "no answer"
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            status, body = error.code, error.read().decode()
        except OSError as error:
            status, body = 0, str(error)
        time.sleep(0.2)
    return status, body
