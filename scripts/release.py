"""Set the release an overlay deploys: ``python scripts/release.py OVERLAY IMAGE``.

IMAGE is ``ghcr.io/selminha/gin:<version>`` or ``ghcr.io/selminha/gin@sha256:<digest>``; the
overlay's ``images:`` entry for the workloads' placeholder ``gin`` gets it, as
``kustomize edit set image gin=IMAGE`` would write it (newName and newTag, or newName and
digest), and nothing else in the file changes. Refused, with the file left as it was: ``latest``,
a reference with neither tag nor digest, a malformed digest, and in prod a tag that is not a
version (``1.2.3``, ``v1.2.3``, ``1.2.3-rc.1``). deploy/README.md, "Deploy", says when to run it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = ROOT / "deploy" / "k8s" / "overlays"
PLACEHOLDER = "gin"
REFERENCE = re.compile(
    r"(?P<name>[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
VERSION = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?")


class Refused(ValueError):
    """An image reference an overlay may not deploy."""


def entry(overlay: str, image: str) -> list[str]:
    """The overlay's ``images:`` entry for ``image``, as YAML lines; Refused when not allowed."""
    match = REFERENCE.fullmatch(image)
    if match is None:
        raise Refused(f"{image!r} is not an image reference (name:tag or name@sha256:digest)")
    name, tag, digest = match["name"], match["tag"], match["digest"]
    if tag is None and digest is None:
        raise Refused(f"{image!r} has neither tag nor digest: which release is it?")
    if tag == "latest":
        raise Refused("latest names no release: give a version tag or a digest")
    if overlay == "prod" and digest is None and not VERSION.fullmatch(tag or ""):
        raise Refused(f"prod deploys a version tag (1.2.3) or a digest, not {tag!r}")
    lines = ["images:", f"  - name: {PLACEHOLDER}", f"    newName: {name}"]
    lines.append(f"    digest: {digest}" if digest else f"    newTag: {tag}")
    return lines


def set_image(kustomization: Path, overlay: str, image: str) -> None:
    """Replace the top-level ``images:`` block of a kustomization file with ``image``'s."""
    new = entry(overlay, image)
    lines = kustomization.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.rstrip() == "images:"]
    if len(starts) != 1:
        raise Refused(f"{kustomization}: expected one top-level images: block")
    start = end = starts[0]
    while end + 1 < len(lines) and (lines[end + 1].startswith((" ", "-")) or not lines[end + 1]):
        end += 1
    while end > start and not lines[end]:
        end -= 1
    kustomization.write_text("\n".join([*lines[:start], *new, *lines[end + 1 :]]) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n", 1)[0], file=sys.stderr)
        return 2
    overlay, image = argv
    path = OVERLAYS / overlay / "kustomization.yaml"
    if not path.is_file():
        print(f"release: no overlay {overlay!r} (in {OVERLAYS})", file=sys.stderr)
        return 2
    try:
        set_image(path, overlay, image)
    except Refused as exc:
        print(f"release: refused: {exc}", file=sys.stderr)
        return 1
    print(f"release: {overlay} deploys {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
