"""Private library internals are bounded (issue 14, part 9): ``pyproject.toml`` allows only the
versions ``shared/infra/internals.py`` was tested with, and a service on any other version
exits at once with one line naming the library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest

from shared.infra import amqp, db, internals
from tests.e2e.processes import ROOT, free_port


def test_pyproject_bounds_are_the_tested_versions() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, (low, high) in internals.TESTED.items():
        assert f"{name}>={low},<{high}" in dependencies, name


def test_the_installed_versions_are_tested_ones() -> None:
    assert internals.untested() == []
    internals.check_versions()


@pytest.mark.parametrize(
    ("asyncpg", "aiormq", "refused"),
    [
        ("0.32.0", "7.2.4", []),
        ("0.32.9rc1", "7.2.0", []),
        ("0.33.0", "7.2.4", ["asyncpg 0.33.0"]),
        ("0.31.0", "7.2.4", ["asyncpg 0.31.0"]),
        ("0.32.0", "8.0.0", ["aiormq 8.0.0"]),
        ("1.0", "7.3.0a1", ["asyncpg 1.0", "aiormq 7.3.0a1"]),
    ],
)
def test_a_version_outside_the_tested_range_is_named(
    asyncpg: str, aiormq: str, refused: list[str]
) -> None:
    versions = {"asyncpg": asyncpg, "aiormq": aiormq, "aiohttp": "3.14.5"}
    lines = internals.untested(versions.__getitem__)
    assert [" ".join(line.split()[:2]) for line in lines] == refused
    assert all("tested with" in line for line in lines)


def test_the_old_homes_still_name_the_same_objects() -> None:
    assert db.FairPool is internals.FairPool
    assert db.PoolExhausted is internals.PoolExhausted
    assert amqp.publish_confirmed is internals.publish_confirmed


@pytest.mark.parametrize("module", ["services.table", "services.bots"])
def test_a_service_on_an_untested_asyncpg_refuses_to_start_with_one_line(module: str) -> None:
    real = metadata.version("asyncpg")
    assert real != "0.99.0"
    pretend = (
        "import importlib.metadata as m, runpy; real = m.version;"
        " m.version = lambda n: '0.99.0' if n == 'asyncpg' else real(n);"
        f" runpy.run_module({module!r}, run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIN_")}
    env.update(GIN_HTTP_PORT=str(free_port()), GIN_DATABASE_URL="postgresql://x@127.0.0.1:1/x")
    reason = (
        "asyncpg 0.99.0 is not a version shared/infra/internals.py was tested with (>=0.32,<0.33)"
    )
    for log_format in ("console", "json"):
        done = subprocess.run(
            [sys.executable, "-c", pretend],
            env={**env, "GIN_LOG_FORMAT": log_format},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert done.stdout == ""
        if log_format == "console":
            assert done.stderr.splitlines() == [f"refusing to start: {reason}"]
        else:
            [line] = done.stderr.splitlines()
            assert json.loads(line) == {
                "event": "refusing_to_start",
                "level": "critical",
                "reason": reason,
            }
