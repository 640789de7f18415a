"""The runbook's Secrets for the broker users, run as written (issue 27).

The Messaging Topology Operator (1.20 and later) refuses a ``User`` whose credentials Secret
lacks the label ``rabbitmq.com/topology-operator=true``: every service, KEDA and every
subscriber would get ACCESS_REFUSED. These tests run deploy/README.md's shell blocks with a
``kubectl`` that records what it is asked (and, for ``--dry-run``, ``label --local`` and
``apply``, does what kubectl does with the YAML), and check that every User's Secret is made
with its keys and labelled, and that the rotation leaves a labelled Secret whose password and
url agree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_manifests import KUBECTL, RUNBOOK, of_kind, rendered

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays")
LABEL = ("rabbitmq.com/topology-operator", "true")
# A kubectl that logs each call as a JSON line in $KUBECTL_LOG; `create secret generic ...
# --dry-run=client -o yaml` prints the Secret, `label -f - --local -o yaml K=V` labels the YAML
# it reads, `apply -f -` logs the YAML it reads.
FAKE_KUBECTL = r"""
import json, os, sys, yaml
args = sys.argv[1:]
entry = {"args": args}
if "apply" in args:
    entry["applied"] = yaml.safe_load(sys.stdin.read())
elif "label" in args and "--local" in args:
    obj = yaml.safe_load(sys.stdin.read())
    for pair in [a for a in args if "=" in a and not a.startswith("-")]:
        key, value = pair.split("=", 1)
        obj.setdefault("metadata", {}).setdefault("labels", {})[key] = value
    sys.stdout.write(yaml.safe_dump(obj))
elif "create" in args and "--dry-run=client" in args:
    name = args[args.index("generic") + 1]
    data = {}
    for arg in args:
        if arg.startswith("--from-literal="):
            key, value = arg[len("--from-literal="):].split("=", 1)
            data[key] = value
    sys.stdout.write(yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data}
    ))
with open(os.environ["KUBECTL_LOG"], "a") as log:
    log.write(json.dumps(entry) + "\n")
"""


def shell_blocks(section: str) -> list[str]:
    """The ```sh blocks of a runbook section (## or ###), in order."""
    text = RUNBOOK.read_text()
    body = text.split(f"\n{section}\n", 1)[1]
    level = section.split(" ", 1)[0]
    body = re.split(rf"\n{level} ", body, maxsplit=1)[0]
    return re.findall(r"```sh\n(.*?)```", body, flags=re.DOTALL)


def run(script: str, tmp_path: Path) -> list[dict[str, Any]]:
    """Run a shell block with the fake kubectl first on PATH; its calls, in order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "kubectl"
    fake.write_text(f"#!{sys.executable}\n{FAKE_KUBECTL}")
    fake.chmod(0o755)
    log = tmp_path / "kubectl.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KUBECTL_LOG": str(log),
        "BACKUP_KEY_ID": "key-id",
        "BACKUP_KEY": "key",
        "SITE_TOKEN_SECRET": "s" * 48,
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def created(calls: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The Secrets the calls create, by name, with their literal keys."""
    secrets: dict[str, dict[str, str]] = {}
    for call in calls:
        args = call["args"]
        if args[:1] == ["-n"] and "create" in args and "secret" in args:
            name = args[args.index("generic") + 1]
            literals = [a[len("--from-literal=") :] for a in args if "--from-literal=" in a]
            secrets[name] = dict(literal.split("=", 1) for literal in literals)
    return secrets


def labelled(calls: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The labels the calls put on Secrets, by name."""
    labels: dict[str, dict[str, str]] = {}
    for call in calls:
        args = call["args"]
        if "label" in args and "secret" in args:
            name = args[args.index("secret") + 1]
            pairs = [a for a in args[args.index("secret") + 2 :] if "=" in a]
            labels.setdefault(name, {}).update(p.split("=", 1) for p in pairs)
    return labels


def user_secrets() -> dict[str, str]:
    """Each prod User's credentials Secret, by the User's name."""
    return {
        user["metadata"]["name"]: user["spec"]["importCredentialsSecret"]["name"]
        for user in of_kind(rendered("prod"), "User")
    }


def test_every_broker_users_secret_is_made_labelled(tmp_path: Path) -> None:
    (make,) = [b for b in shell_blocks("## Secrets") if "create secret" in b and "NS=gin" in b]
    calls = run(make, tmp_path)
    secrets, labels = created(calls), labelled(calls)
    users = user_secrets()
    assert len(users) == 5
    for user, secret in users.items():
        assert secret in secrets, f"the runbook does not make {secret} (User {user})"
        assert {"username", "password"} <= set(secrets[secret]), secret
        assert secrets[secret]["username"] == user
        assert labels.get(secret, {}).get(LABEL[0]) == LABEL[1], f"{secret} lacks the label"
        password = secrets[secret]["password"]
        assert re.fullmatch(r"[0-9a-f]{48}", password), "letters and digits only: in a URL"
        url = secrets[secret].get("url") or secrets[secret]["host"]
        assert f"{user}:{password}@" in url
    # Only the broker users' Secrets: the operator need not watch the others.
    assert set(labels) == set(users.values())


def test_the_rotation_leaves_a_labelled_secret_whose_password_and_url_agree(
    tmp_path: Path,
) -> None:
    (rotate,) = [b for b in shell_blocks("## Secrets") if "rollout restart" in b]
    calls = run(rotate, tmp_path)
    (applied,) = [c["applied"] for c in calls if "applied" in c]
    assert applied["kind"] == "Secret"
    name = applied["metadata"]["name"]
    assert name in user_secrets().values()
    assert applied["metadata"]["labels"][LABEL[0]] == LABEL[1]
    data = applied["stringData"]
    assert f":{data['password']}@" in data["url"]
    user = next(u for u, s in user_secrets().items() if s == name)
    assert data["username"] == user
    restarts = [c["args"] for c in calls if "rollout" in c["args"]]
    assert restarts == [["-n", "gin", "rollout", "restart", f"deploy/{user}"]]


def test_the_fake_kubectl_notices_a_missing_label(tmp_path: Path) -> None:
    """The check can fail: the runbook's block without its label loop leaves Secrets bare."""
    (make,) = [b for b in shell_blocks("## Secrets") if "create secret" in b and "NS=gin" in b]
    bare = re.sub(r"\nfor s in gin-table-amqp.*?\ndone", "", make, flags=re.DOTALL)
    assert bare != make
    labels = labelled(run(bare, tmp_path))
    assert not any(labels.get(s) for s in user_secrets().values())
