#!/usr/bin/env python3
"""Build the Dockerfile here, with Debian's buildah, on a base made from Debian's packages.

Used by ``make image`` and ``tests/deploy/test_image.py`` (standard library only)::

    python3 scripts/image.py build [--tag ghcr.io/selminha/gin:dev] [--refresh-base]
    python3 scripts/image.py base [--refresh]       # only the base
    python3 scripts/image.py run [podman run arguments...]

No registry of images is needed: the Dockerfile's ``PYTHON_IMAGE`` is ``BASE_IMAGE``, a root
filesystem of Debian bookworm's ``python3`` (3.11, as in ``python:3.11-slim-bookworm``) made
with ``mmdebstrap`` and imported into the machine's container storage. It is made again only
when what it is made of changes (``base_key``, kept as the image's label), or with
``--refresh-base`` (to take Debian's security updates). The builder stage reaches PyPI over
the host's network (``--network host``) and trusts what the host trusts: the host's CA bundle is
mounted over the base's for the ``RUN`` steps only, so a TLS-inspecting proxy works and the
image keeps Debian's bundle. ``RUN`` steps use buildah's chroot isolation, which needs no OCI
runtime and no cgroup.

``run`` is ``podman run`` with what this kind of machine needs (``RUN_FLAGS``): runc, and the
limits this process has, not podman's higher defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TAG = "ghcr.io/selminha/gin:dev"  # what the dev overlay deploys
BASE_IMAGE = "localhost/gin-python:3.11-bookworm"
BASE_LABEL = "org.selminha.gin.base-key"
# What the base is made of: Debian bookworm with its point and security updates, the python3
# the Dockerfile's builder calls as ``python`` (and whose venv lives in lib/python3.11), the
# ensurepip its ``python -m venv`` needs, groupadd/useradd for its runtime stage, the CA bundle.
SUITE = "bookworm"
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
PACKAGES = ("python3", "python3-venv", "python-is-python3", "passwd", "ca-certificates")
# As Debian's slim images: no manuals, translations or documents but the licences (also for
# whatever apt installs into the image later: the options stay in /etc/dpkg/dpkg.cfg.d).
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
BASE_CONFIG = ("ENV LANG=C.UTF-8", 'CMD ["python3"]')
TOOLS = ("buildah", "podman", "mmdebstrap")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
LOCK = Path(tempfile.gettempdir()) / "gin-image-base.lock"
# The processes a container may start: the services need a handful; a limit above this
# process's own (podman asks for far more) is refused without CAP_SYS_RESOURCE.
NPROC = 4096


class ImageError(Exception):
    """Why the image could not be built (a missing tool, a failed command)."""


def missing_tools() -> list[str]:
    """The tools this script needs that are not installed (``make image-tools`` installs them)."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def base_key() -> str:
    """A digest of everything the base is made of: a change in it makes the base again."""
    made_of = {
        "suite": SUITE,
        "sources": SOURCES,
        "packages": PACKAGES,
        "dpkg": DPKG_OPTIONS,
        "config": BASE_CONFIG,
    }
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]


def image_label(image: str, label: str) -> str | None:
    """The image's label, "" when it has none, None when there is no such image."""
    found = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Labels}}", image],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        return None
    labels = json.loads(found.stdout.strip() or "null") or {}
    return str(labels.get(label, ""))


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One base made at a time on this machine (two test runs may start together)."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(command: Sequence[str], what: str) -> None:
    """``command``, its output passed on; its last lines in the error when it fails."""
    print("+", " ".join(command), file=sys.stderr, flush=True)
    last: deque[str] = deque(maxlen=12)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stderr.write(line)
            last.append(line)
    if process.returncode != 0:
        raise ImageError(
            f"{what} failed (exit {process.returncode}): {' '.join(command)}\n{''.join(last)}"
        )


def cannot_run() -> str | None:
    """Why this machine cannot run the build's steps or a container of the base, or None.

    Checked before a build, so that a test can tell a machine that cannot (no privileges to
    mount or chroot, a runtime that fails here) from a Dockerfile that does not build.
    """
    container = f"gin-probe-{os.getpid()}"
    checks = (
        (["buildah", "from", "--quiet", f"--name={container}", BASE_IMAGE], "buildah from"),
        (["buildah", "run", "--isolation=chroot", container, "true"], "buildah run (chroot)"),
        (run_command(["--rm", "--network=host", BASE_IMAGE, "true"]), "podman run"),
    )
    try:
        for command, what in checks:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace")
            if done.returncode != 0:
                return f"{what} fails here: {(done.stderr or done.stdout).strip()}"
        return None
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


def ensure_base(refresh: bool = False) -> str:
    """``BASE_IMAGE``, made with mmdebstrap and imported unless it is made of the same."""
    _require_tools()
    key = base_key()
    with locked():
        if not refresh and image_label(BASE_IMAGE, BASE_LABEL) == key:
            print(f"base: {BASE_IMAGE} is current ({key})", file=sys.stderr)
            return "current"
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="gin-base-", dir="/var/tmp") as tmp:
            tarball = Path(tmp) / "rootfs.tar"
            _run(
                [
                    "mmdebstrap",
                    "--quiet",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
                    # The Dockerfile's path /opt/venv/lib/python3.11 holds only with 3.11.
                    '--customize-hook=test -x "$1/usr/bin/python3.11"',
                    SUITE,
                    str(tarball),
                    *SOURCES,
                ],
                "making the base's root filesystem",
            )
            changes = [*BASE_CONFIG, f"LABEL {BASE_LABEL}={key}"]
            _run(
                [
                    "podman",
                    "import",
                    "--quiet",
                    *(f"--change={change}" for change in changes),
                    str(tarball),
                    BASE_IMAGE,
                ],
                "importing the base",
            )
        print(f"base: {BASE_IMAGE} made in {time.monotonic() - started:.1f} s", file=sys.stderr)
        return "made"


def build(tag: str = DEFAULT_TAG, refresh_base: bool = False) -> str:
    """Build the Dockerfile on ``BASE_IMAGE`` as ``tag``; the image's id."""
    ensure_base(refresh_base)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gin-image-") as tmp:
        iidfile = Path(tmp) / "iid"
        trust = (
            ["--volume", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
            if HOST_CA_BUNDLE.is_file()
            else []
        )
        _run(
            [
                "buildah",
                "build",
                "--isolation=chroot",
                "--network=host",
                "--layers",
                "--force-rm",  # no working container left behind by a failed step
                f"--build-arg=PYTHON_IMAGE={BASE_IMAGE}",
                *trust,
                f"--iidfile={iidfile}",
                f"--tag={tag}",
                f"--file={ROOT / 'Dockerfile'}",
                str(ROOT),
            ],
            "building the Dockerfile",
        )
        image_id = iidfile.read_text().strip().removeprefix("sha256:")
    print(f"image: {tag} ({image_id[:12]}) built in {time.monotonic() - started:.1f} s")
    # The layers cached by older builds go after a day (the tagged images stay): a build
    # after a change of code otherwise leaves the old layers behind, and the disk fills.
    subprocess.run(
        ["podman", "image", "prune", "--force", "--filter=until=24h"],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    return image_id


def run_flags() -> list[str]:
    """``podman run``'s options for this kind of machine.

    runc, when installed: Debian 12's crun refuses a hybrid cgroup hierarchy ("cgroups in
    hybrid mode not supported, drop all controllers from cgroupv2"). The limits: podman asks
    for more open files and processes than a root without CAP_SYS_RESOURCE may set
    ("setrlimit `RLIMIT_NOFILE`: Operation not permitted").
    """
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)  # never unlimited
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = NPROC if nproc == resource.RLIM_INFINITY else min(nproc, NPROC)
    runtime = ["--runtime=runc"] if shutil.which("runc") else []
    return [*runtime, f"--ulimit=nofile={nofile}:{nofile}", f"--ulimit=nproc={nproc}:{nproc}"]


def run_command(arguments: Sequence[str]) -> list[str]:
    """``podman run`` with ``run_flags`` and ``arguments`` (options, image, command)."""
    return ["podman", "run", *run_flags(), *arguments]


def _require_tools() -> None:
    missing = missing_tools()
    if missing:
        raise ImageError(
            f"{', '.join(missing)} not installed: make image-tools installs Debian's packages"
        )


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["run"]:
        command = run_command(argv[1:])
        print("+", " ".join(command), file=sys.stderr, flush=True)
        os.execvp(command[0], command)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    built = commands.add_parser("build", help="the base when needed, then the Dockerfile")
    built.add_argument("--tag", default=DEFAULT_TAG)
    built.add_argument("--refresh-base", action="store_true", help="make the base again")
    base = commands.add_parser("base", help="only the base")
    base.add_argument("--refresh", action="store_true", help="make it even when current")
    commands.add_parser("run", help="podman run with this machine's options, then its own")
    args = parser.parse_args(argv)
    try:
        if args.command == "base":
            ensure_base(args.refresh)
        else:
            build(args.tag, args.refresh_base)
    except ImageError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
