#!/usr/bin/env python3
"""The dependency locks: ``requirements/service.txt`` and ``requirements/dev.txt``.

``service.txt`` pins what the image runs: pyproject's ``[project] dependencies`` and its
``[build-system] requires`` (setuptools builds the wheel with ``--no-build-isolation``, so the
build is locked too). ``dev.txt`` pins those at the same versions plus the ``dev`` extra: what
``make venv`` installs. Both are for CPython 3.11 on Linux, x86_64 and aarch64 (the image is
python:3.11-slim-bookworm), with the hash of every file of every pinned version, so that
``pip install --require-hashes`` installs exactly the locked set or nothing.

    lock [--upgrade | --upgrade-package NAME ...]   make lock: resolve (uv pip compile) again,
                                                    keeping each pin pyproject still allows
    check                                           make check: the locks agree with pyproject
                                                    (offline, quick)
    audit                                           make check: pip-audit on the locks; skipped,
                                                    with a message, when the advisory data
                                                    cannot be reached
    prune                                           make venv: uninstall what the lock lacks

Each lock's header holds the sha256 of the pyproject lists it was made from (``# inputs:``),
so a lock made from another pyproject is caught even when its pins happen to satisfy it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"
SERVICE = LOCKS / "service.txt"
DEV = LOCKS / "dev.txt"
PYTHON = "3.11"
# uv's target platforms: glibc 2.28 or later (bookworm has 2.36), both architectures. The lock
# is written from the first; the second must resolve to the same pins.
PLATFORMS = ("x86_64-manylinux_2_28", "aarch64-manylinux_2_28")
INDEX = "https://pypi.org/simple"
# Markers are evaluated as on the image.
ENVIRONMENT = {
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
}
INPUTS_RE = re.compile(r"^# inputs: sha256:([0-9a-f]{64})$", re.MULTILINE)
HEADERS = {
    "service": (
        "# The service's locked dependencies (pyproject's [project] dependencies) and the wheel\n"
        "# build's ([build-system] requires): what the image installs, with --require-hashes.\n"
    ),
    "dev": (
        "# The development set: service.txt's pins at the same versions and the dev extra: what\n"
        "# make venv installs, with --require-hashes.\n"
    ),
}
COMMON_HEADER = (
    "# CPython 3.11, Linux x86_64 and aarch64; every file's hash. Made by `make lock`\n"
    "# (scripts/lock.py, uv pip compile): do not edit.\n"
)


@dataclass
class Pin:
    """One locked requirement: ``name==version`` and its hashes."""

    name: str
    version: str
    hashes: list[str] = field(default_factory=list)
    marker: str = ""


@dataclass
class LockFile:
    """A parsed lock: its pins by canonical name, its inputs' hash, its malformed lines."""

    path: Path
    pins: dict[str, Pin]
    inputs: str | None
    errors: list[str]


def pyproject_lists(pyproject: Path) -> dict[str, list[str]]:
    """The requirement lists a lock is made from, by the lock they go into."""
    data = tomllib.loads(pyproject.read_text())
    dependencies = list(data["project"].get("dependencies", []))
    build = list(data.get("build-system", {}).get("requires", []))
    dev = list(data["project"].get("optional-dependencies", {}).get("dev", []))
    return {"service": dependencies + build, "dev": dependencies + build + dev}


def inputs_hash(requirements: Sequence[str]) -> str:
    """The sha256 of a requirement list, as normalized requirements in sorted order.

    Comments, order and spacing do not change it; a bound, a marker or a name does.
    """
    normalized = sorted(str(Requirement(r)) for r in requirements)
    return hashlib.sha256("\n".join(normalized).encode()).hexdigest()


def parse_lock(path: Path) -> LockFile:
    """Read a lock written by ``lock``: pins with their hashes, and the header's inputs hash."""
    text = path.read_text()
    found = INPUTS_RE.search(text)
    pins: dict[str, Pin] = {}
    errors: list[str] = []
    # A requirement runs over continuation lines ending in a backslash.
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line and not current:
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    if current:
        logical.append(current)
    for entry in logical:
        hashes = re.findall(r"--hash=(\S+)", entry)
        spec = re.sub(r"--hash=\S+", "", entry).strip()
        if spec.startswith("-"):
            errors.append(f"{path.name}: an option line, not a pin: {spec}")
            continue
        try:
            requirement = Requirement(spec)
        except ValueError as error:
            errors.append(f"{path.name}: unreadable line {spec!r} ({error})")
            continue
        versions = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(requirement.specifier) != 1 or not versions or "*" in versions[0]:
            errors.append(f"{path.name}: {spec} is not pinned with ==")
            continue
        if not hashes:
            errors.append(f"{path.name}: {spec} has no --hash")
        name = canonicalize_name(requirement.name)
        marker = str(requirement.marker) if requirement.marker else ""
        pins[name] = Pin(name, versions[0], hashes, marker)
    return LockFile(path, pins, found.group(1) if found else None, errors)


def disagreements(pyproject: Path, service: Path, dev: Path) -> list[str]:
    """Every way the locks disagree with pyproject (or each other); empty when they agree."""
    lists = pyproject_lists(pyproject)
    problems: list[str] = []
    locks = {}
    for kind, path in (("service", service), ("dev", dev)):
        if not path.exists():
            problems.append(f"{path.name} is missing: run make lock")
            continue
        lock = locks[kind] = parse_lock(path)
        problems += lock.errors
        wanted = inputs_hash(lists[kind])
        if lock.inputs != wanted:
            problems.append(
                f"{path.name} was made from another pyproject (its inputs hash "
                f"{(lock.inputs or 'none')[:12]}, pyproject's {wanted[:12]}): run make lock"
            )
        for line in lists[kind]:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(ENVIRONMENT):
                continue
            pin = lock.pins.get(canonicalize_name(requirement.name))
            if pin is None:
                problems.append(f"{path.name} lacks pyproject's {requirement}")
            elif not requirement.specifier.contains(Version(pin.version), prereleases=True):
                problems.append(
                    f"{path.name} pins {pin.name} {pin.version}, outside pyproject's {requirement}"
                )
    if "service" in locks and "dev" in locks:
        for name, pin in locks["service"].pins.items():
            other = locks["dev"].pins.get(name)
            if other is None or other.version != pin.version:
                found = other.version if other else "nothing"
                problems.append(f"dev.txt pins {name} {found} where service.txt pins {pin.version}")
    return problems


def check(pyproject: Path = ROOT / "pyproject.toml") -> int:
    """``make check``: exit 1 naming each disagreement between pyproject and the locks."""
    problems = disagreements(pyproject, SERVICE, DEV)
    for problem in problems:
        print(f"lock: {problem}", file=sys.stderr)
    return 1 if problems else 0


# --- make lock -------------------------------------------------------------------------------


def _uv() -> str:
    """The uv beside this interpreter (the venv's, a dev dependency), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if found is None:
        raise SystemExit("lock: uv is not installed: make venv installs it")
    return found


def _compile(
    inputs: Path,
    output: Path,
    platform: str,
    constraints: Path | None,
    upgrade: Sequence[str],
) -> None:
    """One ``uv pip compile``; ``output``'s existing pins are kept where still allowed."""
    command = [
        _uv(),
        "pip",
        "compile",
        "--quiet",
        "--no-config",  # neither a uv.toml nor the machine's settings choose the index
        "--default-index",
        INDEX,
        "--python-version",
        PYTHON,
        "--python-platform",
        platform,
        "--generate-hashes",
        "--no-header",
        "--output-file",
        str(output),
        str(inputs),
    ]
    if constraints is not None:
        command += ["--constraints", str(constraints)]
    command += upgrade
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    subprocess.run(command, check=True, env=env)


def _pins(path: Path) -> dict[str, str]:
    return {name: pin.version for name, pin in parse_lock(path).pins.items()}


def _write(kind: str, compiled: Path, work: Path, target: Path, digest: str) -> None:
    body = compiled.read_text()
    body = body.replace(f"-r {work / (kind + '.in')}", "pyproject.toml")
    body = body.replace(f"-c {work / 'service-pins.txt'}", "service.txt")
    text = HEADERS[kind] + COMMON_HEADER + f"# inputs: sha256:{digest}\n" + body
    # An unchanged lock keeps its mtime: make venv's stamp depends on it.
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def lock(upgrade: Sequence[str], pyproject: Path = ROOT / "pyproject.toml") -> None:
    """``make lock``: resolve both locks again for both platforms, and write them."""
    lists = pyproject_lists(pyproject)
    LOCKS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        constraints = work / "service-pins.txt"
        for kind, target in (("service", SERVICE), ("dev", DEV)):
            inputs = work / f"{kind}.in"
            inputs.write_text("\n".join(lists[kind]) + "\n")
            results: dict[str, Path] = {}
            for platform in PLATFORMS:
                output = work / f"{kind}-{platform}.txt"
                if target.exists():  # its pins are uv's preferences
                    shutil.copyfile(target, output)
                _compile(
                    inputs,
                    output,
                    platform,
                    constraints if kind == "dev" else None,
                    upgrade,
                )
                results[platform] = output
            first, *others = (_pins(results[p]) for p in PLATFORMS)
            for platform, pins in zip(PLATFORMS[1:], others, strict=True):
                if pins != first:
                    differ = sorted(set(pins.items()) ^ set(first.items()))
                    raise SystemExit(
                        f"lock: {kind} resolves differently on {platform}: {differ}: "
                        "make the two agree in pyproject (a bound or a marker)"
                    )
            _write(kind, results[PLATFORMS[0]], work, target, inputs_hash(lists[kind]))
            if kind == "service":
                constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(first.items())))
            print(f"lock: {target.relative_to(ROOT)}: {len(first)} pins")


# --- make check: the audit -------------------------------------------------------------------

NETWORK_ERRORS = (
    "requests.exceptions.ConnectionError",
    "requests.exceptions.ProxyError",
    "requests.exceptions.SSLError",
    "requests.exceptions.Timeout",
    "requests.exceptions.ReadTimeout",
    "requests.exceptions.ConnectTimeout",
    "Max retries exceeded",
    "Temporary failure in name resolution",
)


def audit_verdict(returncode: int, report: dict[str, Any] | None, stderr: str) -> tuple[int, str]:
    """What pip-audit's run means: (exit status, message).

    Known vulnerabilities fail. Advisory data that could not be reached (a network error, or
    PyPI answering that it has no data for the pinned versions, which pip-audit itself lets
    pass as "not found") is a skip that says so: an audit that did not happen is not a pass.
    """
    if report is None:
        if any(marker in stderr for marker in NETWORK_ERRORS):
            error = re.search(r"requests\.exceptions\.(\w+)", stderr)
            host = re.search(r"host='([^']+)'", stderr)
            what = " ".join(
                part
                for part in (
                    error.group(1) if error else "a network error",
                    f"from {host.group(1)}" if host else "",
                )
                if part
            )
            return 0, f"pip-audit skipped: the advisory data could not be reached ({what})"
        return 1, f"pip-audit failed (exit {returncode}):\n{stderr.strip()[-2000:]}"
    dependencies = report.get("dependencies", [])
    vulnerable = [d for d in dependencies if d.get("vulns")]
    skipped = [d for d in dependencies if d.get("skip_reason")]
    if vulnerable:
        lines = []
        for d in vulnerable:
            for v in d["vulns"]:
                fixes = ", ".join(v.get("fix_versions") or []) or "none yet"
                lines.append(f"  {d['name']} {d.get('version', '')}: {v['id']} (fixed in {fixes})")
        return 1, "pip-audit: known vulnerabilities in the lock:\n" + "\n".join(lines)
    audited = len(dependencies) - len(skipped)
    if skipped and not audited:
        return 0, (
            f"pip-audit skipped: no advisory data for any of the {len(skipped)} pins "
            f"(the vulnerability service cannot be reached: {skipped[0]['skip_reason']})"
        )
    if skipped:
        names = ", ".join(d["name"] for d in skipped)
        return 0, (
            f"pip-audit: no known vulnerabilities in {audited} pins; {len(skipped)} "
            f"not audited (no advisory data): {names}"
        )
    return 0, f"pip-audit: no known vulnerabilities in {audited} pins"


# pip-audit's vulnerability services, in the order asked: PyPI's JSON API, then OSV's when
# PyPI gave no data (both serve the same advisory database, PyPA's).
SERVICES = ("pypi", "osv")


def _pip_audit(path: Path, service: str, timeout_s: float) -> tuple[int, str]:
    """One pip-audit run on ``path`` against ``service``: its verdict."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        command = [
            sys.executable,  # as a module: a venv script's first line names the venv's old path
            "-m",
            "pip_audit",
            "--disable-pip",  # the lock is complete and hashed: nothing to resolve or install
            "--requirement",
            str(path),
            "--vulnerability-service",
            service,
            "--progress-spinner",
            "off",
            "--timeout",
            "5",
            "--format",
            "json",
            "--output",
            str(out),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return 0, f"pip-audit skipped: no answer from the advisory service in {timeout_s:.0f} s"
        report = json.loads(out.read_text()) if out.exists() and out.stat().st_size else None
        return audit_verdict(done.returncode, report, done.stderr)


def audit(path: Path = DEV, timeout_s: float = 60) -> int:
    """``make check``: pip-audit on a lock (dev.txt holds service.txt's pins), offline-tolerant."""
    skips = []
    for service in SERVICES:
        status, message = _pip_audit(path, service, timeout_s)
        if status or not message.startswith("pip-audit skipped: "):
            break
        skips.append(f"{service}: {message.removeprefix('pip-audit skipped: ')}")
    else:
        message = "pip-audit skipped: " + "; ".join(skips)
    print(message, file=sys.stderr if status else sys.stdout)
    return status


# --- make venv -------------------------------------------------------------------------------


def prune(path: Path = DEV, keep: Sequence[str] = ("selminha-gin", "pip")) -> int:
    """Uninstall from this environment what the lock does not pin (a dependency dropped)."""
    pinned = set(parse_lock(path).pins) | {canonicalize_name(k) for k in keep}
    extra = sorted(
        {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()} - pinned
    )
    if extra:
        print(f"lock: uninstalling what {path.name} does not pin: {', '.join(extra)}")
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--yes", *extra], check=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    renew = commands.add_parser("lock", help="resolve and write both locks")
    renew.add_argument("--upgrade", action="store_true", help="the newest allowed versions")
    renew.add_argument("--upgrade-package", action="append", default=[], metavar="NAME")
    commands.add_parser("check", help="the locks agree with pyproject")
    commands.add_parser("audit", help="pip-audit the locks")
    commands.add_parser("prune", help="uninstall what the dev lock lacks")
    args = parser.parse_args(argv)
    if args.command == "lock":
        upgrade = ["--upgrade"] if args.upgrade else []
        for name in args.upgrade_package:
            upgrade += ["--upgrade-package", name]
        lock(upgrade)
        return check()
    if args.command == "check":
        return check()
    if args.command == "audit":
        return audit()
    return prune()


if __name__ == "__main__":
    sys.exit(main())
