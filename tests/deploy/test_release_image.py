"""One image reference per overlay, the release's, and the runbook's way of setting it (issue 27).

The base named its image ``gin`` and renamed it in its own ``images:`` entry, so the overlays'
entries (which match ``gin``) never applied and every workload rendered
``ghcr.io/selminha/gin:latest``. Now the base keeps the placeholder, each overlay replaces it,
and ``scripts/release.py`` (deploy/README.md, "Deploy") sets the release as
``kustomize edit set image`` would.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_manifests import (
    K8S,
    KUBECTL,
    OVERLAYS,
    ROOT,
    RUNBOOK,
    Obj,
    containers,
    rendered,
    workloads,
)
from tests.deploy.test_subscriber_component import render

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays")
RELEASE = ROOT / "scripts" / "release.py"
REPOSITORY = "ghcr.io/selminha/gin"
VERSION_TAG = re.compile(re.escape(REPOSITORY) + r":v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?")
DIGEST = re.compile(re.escape(REPOSITORY) + r"@sha256:[0-9a-f]{64}")
A_DIGEST = "sha256:" + "0123456789abcdef" * 4


def project_images(objs: tuple[Obj, ...] | list[Obj]) -> set[str]:
    """The image of every container of the project's workloads (not the servers')."""
    return {
        container["image"]
        for workload in workloads(tuple(objs))
        if workload["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "selminha-gin"
        for container in containers(workload)
    }


def release(tree: Path, overlay: str, image: str) -> subprocess.CompletedProcess[str]:
    """The runbook's command, run on a copy of deploy/k8s."""
    script = tree / "scripts" / "release.py"
    return subprocess.run(
        [sys.executable, str(script), overlay, image],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the manifests and the release script, laid out as in the repository."""
    shutil.copytree(K8S, tmp_path / "deploy" / "k8s")
    (tmp_path / "scripts").mkdir()
    shutil.copy(RELEASE, tmp_path / "scripts" / "release.py")
    return tmp_path


def test_each_overlay_renders_one_release_image_for_every_workload() -> None:
    prod = project_images(rendered("prod"))
    assert len(prod) == 1, prod
    (image,) = prod
    assert VERSION_TAG.fullmatch(image) or DIGEST.fullmatch(image), image
    assert project_images(rendered("dev")) == {f"{REPOSITORY}:dev"}
    for overlay in OVERLAYS:
        for workload in workloads(rendered(overlay)):
            for container in containers(workload):
                assert not container["image"].endswith(":latest"), container["image"]
                assert container["image"] != "gin", "the placeholder was not replaced"


def test_the_base_keeps_the_placeholder_for_the_overlays_to_replace() -> None:
    """A rename in the base would hide the placeholder from every overlay's images: entry."""
    base = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    assert "images" not in base
    assert project_images(render(K8S / "base")) == {"gin"}


def test_the_runbook_sets_the_release_with_the_script() -> None:
    deploy = RUNBOOK.read_text().split("## Deploy", 1)[1].split("\n## ", 1)[0]
    assert "python3 scripts/release.py prod ghcr.io/selminha/gin@sha256:" in deploy


@pytest.mark.parametrize(
    "image", [f"{REPOSITORY}:0.2.0", f"{REPOSITORY}:v1.4.0-rc.1", f"{REPOSITORY}@{A_DIGEST}"]
)
def test_a_release_set_the_runbooks_way_is_what_prod_renders(tree: Path, image: str) -> None:
    kustomization = tree / "deploy" / "k8s" / "overlays" / "prod" / "kustomization.yaml"
    before = kustomization.read_text()
    done = release(tree, "prod", image)
    assert done.returncode == 0, done.stderr
    assert project_images(render(kustomization.parent)) == {image}
    # Only the images: entry changed (comments and the rest kept).
    expected = f"    digest: {A_DIGEST}" if "@" in image else f"    newTag: {image.rsplit(':')[-1]}"
    changed = [line for line in kustomization.read_text().splitlines() if line not in before]
    assert changed == [expected]
    # Twice is the same as once.
    assert release(tree, "prod", image).returncode == 0
    assert project_images(render(kustomization.parent)) == {image}


@pytest.mark.parametrize(
    ("overlay", "image"),
    [
        ("prod", f"{REPOSITORY}:latest"),
        ("dev", f"{REPOSITORY}:latest"),
        ("prod", REPOSITORY),
        ("prod", f"{REPOSITORY}:main"),
        ("prod", f"{REPOSITORY}@sha256:abc"),
        ("prod", "not an image"),
    ],
)
def test_the_script_refuses_what_names_no_release(tree: Path, overlay: str, image: str) -> None:
    kustomization = tree / "deploy" / "k8s" / "overlays" / overlay / "kustomization.yaml"
    before = kustomization.read_text()
    done = release(tree, overlay, image)
    assert done.returncode == 1
    assert "refused" in done.stderr
    assert kustomization.read_text() == before


def test_dev_may_deploy_a_named_build(tree: Path) -> None:
    done = release(tree, "dev", f"{REPOSITORY}:pr-123")
    assert done.returncode == 0, done.stderr
    dev = tree / "deploy" / "k8s" / "overlays" / "dev"
    assert project_images(render(dev)) == {f"{REPOSITORY}:pr-123"}
