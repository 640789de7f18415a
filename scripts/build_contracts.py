#!/usr/bin/env python3
"""``make contracts-dist``: ``shared/contracts`` as its own distribution, selminha-gin-contracts.

What another team's service installs to read our events (docs/subscribing.md): the envelope,
every event, command and view, the names, and the tolerant decoders, with msgspec as its only
dependency. The wheel holds the package ``shared.contracts`` (``shared`` is a namespace
package there) and nothing else of the backend. Its major version is the contracts'
``SCHEMA_VERSION``; a release that adds to the contracts raises the minor.

    python scripts/build_contracts.py [OUT_DIR]    (default: dist/)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shared" / "contracts"
NAME = "selminha-gin-contracts"
MSGSPEC = "msgspec>=0.18"


def version() -> str:
    """The distribution's version (``shared.contracts.VERSION``)."""
    namespace: dict[str, object] = {}
    exec((PACKAGE / "__init__.py").read_text(), namespace)
    value = namespace["VERSION"]
    assert isinstance(value, str)
    return value


PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
description = "The message contracts of selminha.com's Gin Rummy backend: events, commands, views."
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["{msgspec}"]

[tool.setuptools]
packages = ["shared.contracts"]

[tool.setuptools.package-data]
"shared.contracts" = ["py.typed"]
"""

README = """\
# selminha-gin-contracts

The message contracts of selminha.com's Gin Rummy backend, as msgspec Structs: the envelope
of every event on `gin.events`, every event, command and view, the exchange and queue names,
and `shared.contracts.compat`, which reads what a newer producer wrote (unknown event types
skipped, unknown fields ignored). How to subscribe: docs/subscribing.md of the backend.

```python
from shared.contracts.compat import UnknownEvent, decode_envelope

event = decode_envelope(body)  # an Envelope, or UnknownEvent to skip
```
"""


def build(out: Path) -> Path:
    """Build the wheel into ``out``; its path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="contracts-") as tmp:
        stage = Path(tmp)
        target = stage / "shared" / "contracts"
        target.mkdir(parents=True)
        for source in sorted(PACKAGE.glob("*.py")):
            shutil.copy2(source, target / source.name)
        (target / "py.typed").write_text("")
        (stage / "README.md").write_text(README)
        (stage / "pyproject.toml").write_text(
            PYPROJECT.format(name=NAME, version=version(), msgspec=MSGSPEC)
        )
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), tmp],
            check=True,
        )
    wheel = out / f"{NAME.replace('-', '_')}-{version()}-py3-none-any.whl"
    assert wheel.exists(), f"no {wheel.name} in {out}"
    return wheel


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "dist"))
