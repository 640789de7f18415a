"""selminha-gin-contracts on its own (issue 15, part 4): the wheel ``make contracts-dist``
builds installs into a clean virtual environment with msgspec as its only dependency, holds
nothing of the backend but ``shared.contracts``, and reads our events there.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from types import ModuleType

import msgspec

from shared.contracts import VERSION
from shared.contracts.envelope import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]


def _build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_contracts", ROOT / "scripts" / "build_contracts.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = """
import importlib.metadata as md, importlib.util, json, sys
from shared.contracts.compat import UnknownEvent, decode_envelope
from shared.contracts.envelope import Envelope, wrap
from shared.contracts.events import SeatTaken, Player
from shared.contracts.names import HISTORY_STREAM
from datetime import datetime, timezone
import msgspec
event = wrap("t1", 1, SeatTaken(seat=1, player=Player(name="Ana", id="ana")),
             datetime(2026, 1, 2, tzinfo=timezone.utc), version=2)
again = decode_envelope(msgspec.json.encode(event))
future = decode_envelope(msgspec.json.encode({**msgspec.to_builtins(event), "type": "x",
                                               "data": {"type": "x"}}))
print(json.dumps({
    "round_trip": again == event,
    "future_skipped": isinstance(future, UnknownEvent),
    "requires": md.requires("selminha-gin-contracts"),
    "version": md.version("selminha-gin-contracts"),
    "installed": sorted(d.metadata["Name"].lower() for d in md.distributions()),
    "backend": [m for m in ("shared.infra", "shared.engine", "services", "aiohttp", "asyncpg",
                            "aio_pika") if importlib.util.find_spec(m) is not None],
    "history": HISTORY_STREAM,
    "file": __import__("shared.contracts").contracts.__file__,
}))
"""


def test_the_wheel_installs_alone_with_msgspec_and_reads_events(tmp_path: Path) -> None:
    wheel = _build_script().build(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    code = {n for n in names if not n.startswith("selminha_gin_contracts-")}
    shipped = {p.name for p in (ROOT / "shared" / "contracts").glob("*.py")}
    assert code == {f"shared/contracts/{name}" for name in shipped | {"py.typed"}}

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel)],
        check=True,
        timeout=120,
    )
    done = subprocess.run(
        [str(python), "-I", "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # not the repository: only what is installed
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = msgspec.json.decode(done.stdout)
    assert found["round_trip"]
    assert found["future_skipped"]
    assert found["requires"] == ["msgspec>=0.18"]
    assert found["version"] == VERSION
    assert found["installed"] == ["msgspec", "selminha-gin-contracts"]
    assert found["backend"] == []
    assert found["history"] == "gin.events.history"
    assert str(env) in found["file"]


def test_the_major_version_is_the_schema_version() -> None:
    assert int(VERSION.split(".")[0]) == SCHEMA_VERSION
