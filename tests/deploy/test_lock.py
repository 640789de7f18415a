"""The dependency locks (issue 27, item 8): requirements/service.txt and requirements/dev.txt
agree with pyproject, pin every package with hashes, and are what make venv and the image
install; scripts/lock.py's check catches a pyproject that moved away from them, and its audit
fails on a known vulnerability but skips, saying so, when the advisory data is out of reach.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"


def _load() -> ModuleType:
    if "lock" in sys.modules:
        return sys.modules["lock"]
    spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts" / "lock.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lock"] = module
    spec.loader.exec_module(module)
    return module


lock = _load()


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path, Path]:
    """pyproject.toml and both locks, copied to be changed."""
    paths = []
    for source in (ROOT / "pyproject.toml", REQUIREMENTS / "service.txt", REQUIREMENTS / "dev.txt"):
        target = tmp_path / source.name
        shutil.copyfile(source, target)
        paths.append(target)
    return paths[0], paths[1], paths[2]


def test_the_locks_agree_with_pyproject() -> None:
    assert lock.disagreements(ROOT / "pyproject.toml", lock.SERVICE, lock.DEV) == []


def test_make_check_runs_the_agreement_check_offline_and_fast() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lock.py"), "check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


def test_a_changed_bound_disagrees(copies: tuple[Path, Path, Path]) -> None:
    pyproject, service, dev = copies
    text = pyproject.read_text()
    assert '"aiohttp>=3.14,<3.15"' in text
    pyproject.write_text(text.replace('"aiohttp>=3.14,<3.15"', '"aiohttp>=3.13,<3.14"'))
    problems = lock.disagreements(pyproject, service, dev)
    assert any("service.txt pins aiohttp" in p and "outside" in p for p in problems), problems
    assert any("dev.txt pins aiohttp" in p for p in problems), problems
    assert any("service.txt was made from another pyproject" in p for p in problems), problems


def test_a_bound_the_pins_still_satisfy_is_caught_by_the_inputs_hash(
    copies: tuple[Path, Path, Path],
) -> None:
    pyproject, service, dev = copies
    text = pyproject.read_text()
    pyproject.write_text(text.replace('"pyjwt>=2.8,<3"', '"pyjwt>=2.7,<3"'))
    problems = lock.disagreements(pyproject, service, dev)
    assert len(problems) == 2, problems
    assert all("was made from another pyproject" in p for p in problems), problems


def test_comments_and_order_in_pyproject_do_not_matter(copies: tuple[Path, Path, Path]) -> None:
    pyproject, service, dev = copies
    text = pyproject.read_text()
    moved = text.replace('    "uvloop>=0.19,<1",\n', "").replace(
        '    "aiohttp>=3.14,<3.15",\n',
        '    "aiohttp>=3.14,<3.15",  # a comment\n    "uvloop>=0.19,<1",\n',
    )
    assert moved != text
    pyproject.write_text(moved)
    assert lock.disagreements(pyproject, service, dev) == []


def test_a_new_dependency_missing_from_the_locks_is_named(copies: tuple[Path, Path, Path]) -> None:
    pyproject, service, dev = copies
    text = pyproject.read_text()
    pyproject.write_text(
        text.replace('    "uvloop>=0.19,<1",\n', '    "uvloop>=0.19,<1",\n    "orjson>=3",\n')
    )
    problems = lock.disagreements(pyproject, service, dev)
    assert "service.txt lacks pyproject's orjson>=3" in problems
    assert "dev.txt lacks pyproject's orjson>=3" in problems


def test_the_dev_lock_pins_the_service_lock_at_the_same_versions(
    copies: tuple[Path, Path, Path],
) -> None:
    pyproject, service, dev = copies
    text = dev.read_text()
    version = lock.parse_lock(service).pins["yarl"].version
    dev.write_text(text.replace(f"\nyarl=={version} ", "\nyarl==0.0.1 "))
    problems = lock.disagreements(pyproject, service, dev)
    assert f"dev.txt pins yarl 0.0.1 where service.txt pins {version}" in problems


@pytest.mark.parametrize("name", ["service.txt", "dev.txt"])
def test_every_pin_carries_hashes(name: str) -> None:
    parsed = lock.parse_lock(REQUIREMENTS / name)
    assert parsed.errors == []
    assert parsed.pins
    assert all(pin.hashes for pin in parsed.pins.values())
    assert all(
        re.fullmatch(r"sha256:[0-9a-f]{64}", h) for p in parsed.pins.values() for h in p.hashes
    )
    # Every requirement line of the file is a pin (no option line, nothing unhashed).
    entries = [
        line for line in (REQUIREMENTS / name).read_text().splitlines() if re.match(r"\S", line)
    ]
    pins = [line for line in entries if not line.startswith("#")]
    assert len(pins) == len(parsed.pins)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==\S+ \\", line) for line in pins), pins


def test_a_pin_without_a_hash_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dev.txt"
    path.write_text("yarl==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\nidna==3.0\nattrs>=1\n")
    assert lock.parse_lock(path).errors == [
        "dev.txt: idna==3.0 has no --hash",
        "dev.txt: attrs>=1 is not pinned with ==",
    ]


def test_the_locks_hold_the_chosen_versions() -> None:
    """The lines issue 27 was about: aio-pika 10 (aio-pika 9 needs aiormq<7) and the two
    libraries whose internals we reach into at their tested versions."""
    pins = lock.parse_lock(lock.SERVICE).pins
    assert pins["aio-pika"].version.split(".")[0] == "10"
    assert pins["aiormq"].version.startswith("7.2.")
    assert pins["asyncpg"].version.startswith("0.32.")
    assert "setuptools" in pins  # the wheel's build is locked too


def test_the_dockerfile_installs_the_service_lock_with_hashes() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=" in text
    assert "COPY requirements/service.txt" in text
    runs = re.findall(r"^RUN (.*?)(?<!\\)$", text.replace("\\\n", "\\ "), re.MULTILINE)
    pip = [cmd for run in runs for cmd in run.split("&&") if "pip install" in cmd]
    assert pip, runs
    assert "--require-hashes -r requirements/service.txt" in pip[0]
    # Everything after the lock comes without dependencies: nothing past the lock.
    assert all("--no-deps" in cmd for cmd in pip[1:]), pip
    assert all("--upgrade" not in cmd for cmd in pip), pip
    assert "--no-build-isolation" in text


def test_make_venv_installs_the_dev_lock() -> None:
    done = subprocess.run(
        ["make", "-n", "-B", "-f", "Makefile", "venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    pips = [line for line in done.stdout.splitlines() if "pip install" in line]
    assert "--require-hashes -r requirements/dev.txt" in pips[0], pips
    assert all("--no-deps" in line for line in pips[1:]), pips
    assert all("--upgrade" not in line and "[dev]" not in line for line in pips), pips
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\): .*\$\(DEV_LOCK\)", makefile, re.MULTILINE)


def _venv_stamp(checkout: Path) -> str:
    """The stamp ``make venv`` would look for in ``checkout``."""
    done = subprocess.run(
        ["make", "-s", "--eval", "stamp-name: ; @echo $(STAMP)", "stamp-name"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_make_venv_installs_again_for_another_lock_or_checkout(tmp_path: Path) -> None:
    """The venv is installed again when the lock or pyproject changes, and when another
    checkout uses it (its editable install points at one checkout)."""
    first, second = tmp_path / "first", tmp_path / "second"
    for checkout in (first, second):
        (checkout / "requirements").mkdir(parents=True)
        for name in ("Makefile", "pyproject.toml", "requirements/dev.txt"):
            shutil.copy(ROOT / name, checkout / name)
    stamp = _venv_stamp(first)
    assert stamp.startswith(".venv/.installed-"), stamp
    assert _venv_stamp(first) == stamp  # the same files in the same place: installed once
    assert _venv_stamp(second) != stamp  # another checkout
    with (first / "requirements" / "dev.txt").open("a") as lock:
        lock.write("# a change\n")
    assert _venv_stamp(first) != stamp  # another lock


def test_make_check_checks_and_audits_the_locks() -> None:
    done = subprocess.run(
        ["make", "-n", "check"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "scripts/lock.py check" in done.stdout
    assert "scripts/lock.py audit" in done.stdout


def _report(*dependencies: dict[str, Any]) -> dict[str, Any]:
    return {"dependencies": list(dependencies), "fixes": []}


def test_a_known_vulnerability_fails_the_audit() -> None:
    status, message = lock.audit_verdict(
        1,
        _report(
            {"name": "yarl", "version": "1.25.1", "vulns": []},
            {
                "name": "aiohttp",
                "version": "3.9.0",
                "vulns": [{"id": "GHSA-xxxx", "fix_versions": ["3.9.2"], "aliases": []}],
            },
        ),
        "",
    )
    assert status == 1
    assert "aiohttp 3.9.0: GHSA-xxxx (fixed in 3.9.2)" in message


def test_an_unreachable_advisory_service_skips_with_a_message() -> None:
    stderr = (
        "Traceback (most recent call last):\n ...\nrequests.exceptions.ConnectionError: "
        "HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded"
    )
    status, message = lock.audit_verdict(1, None, stderr)
    assert status == 0
    assert message.startswith("pip-audit skipped: ")


def test_no_advisory_data_at_all_is_a_skip_not_a_pass() -> None:
    reason = "Dependency not found on PyPI and could not be audited: yarl (1.25.1)"
    status, message = lock.audit_verdict(
        0,
        _report({"name": "yarl", "skip_reason": reason}, {"name": "idna", "skip_reason": reason}),
        "",
    )
    assert status == 0
    assert message.startswith("pip-audit skipped: ")


def test_another_pip_audit_failure_fails() -> None:
    status, message = lock.audit_verdict(2, None, "error: unrecognized arguments: --bogus")
    assert status == 1
    assert "unrecognized arguments" in message


def test_a_clean_audit_passes() -> None:
    status, message = lock.audit_verdict(
        0, _report({"name": "yarl", "version": "1.25.1", "vulns": []}), ""
    )
    assert (status, message) == (0, "pip-audit: no known vulnerabilities in 1 pins")


def test_make_checks_audit_skips_without_the_network() -> None:
    """The real pip-audit on the real lock, its every request refused (a proxy nobody listens
    on): make check goes on, saying the audit was skipped."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env |= {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lock.py"), "audit"],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pip-audit skipped: "), done.stdout
    assert "could not be reached" in done.stdout
