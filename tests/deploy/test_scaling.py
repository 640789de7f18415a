"""How production scales the table service (deploy/k8s/overlays/prod/autoscaling.yaml), rendered.

The table replicas have one autoscaler, a KEDA ScaledObject, on two signals: CPU at the share
of a core the runbook's capacity section counts a replica at (deploy/README.md, "How many
matches"), which is also the replica's CPU request, and the table pods' open WebSockets, at a
target under what a replica's files leave for sockets. The figures are read from the runbook's
text, so a change to the request, the targets or the capacity figures alone fails here.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry

from services.table.ws import SocketMetrics
from shared.infra.settings import Settings
from tests.deploy.test_manifests import (
    K8S,
    NAMESPACES,
    OVERLAYS,
    RUNBOOK,
    _settings_of,
    component,
    named,
    of_kind,
    rendered,
)

Obj = dict[str, Any]
TABLE = "gin-table"
# What the plain HPA did before KEDA made it: scale up at once, 3 pods a minute at most; down
# one pod per 2 minutes after 10 quiet minutes (each pod that goes drops its WebSockets).
BEHAVIOR = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": 3, "periodSeconds": 60}],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 600,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
    },
}
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9, "m": 0}


def quantity(text: str | int | float) -> Decimal:
    """A Kubernetes quantity as a number: ``700m`` is 0.7, ``512Mi`` is 536870912."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert match, text
    number, unit = Decimal(match.group(1)), match.group(2)
    if unit == "m":
        return number / 1000
    return number * _UNITS[unit] if unit else number


def _number(text: str) -> int:
    return int(text.replace(",", ""))


class Capacity(NamedTuple):
    """The runbook's figures for one table replica ("How many matches")."""

    cores: Decimal  # the share of a core it runs at
    sockets: Decimal  # the sockets it holds: its matches by sockets, so many a match
    socket_bytes: Decimal  # the memory of one socket
    files: Decimal | None  # the file limit the row assumes, if it names one


def capacity() -> Capacity:
    """The runbook's figures for one table replica, read from its text."""
    text = RUNBOOK.read_text()
    share = re.search(r"one table replica at (\d+) % of a core", text)
    assert share, "the capacity section names the share of a core a replica runs at"
    row = re.search(r"\| by sockets \((\d+) a match, ([^|\n]*)\) \|[^|\n]*\| ([\d,]+) \|", text)
    assert row, "the capacity section's row of matches by sockets"
    per_match, assumed, matches = row.groups()
    kib = re.search(r"(\d+) KiB each", assumed)
    assert kib, "the row names the memory of a socket"
    files = re.search(r"([\d,]+) files", assumed)
    return Capacity(
        cores=Decimal(share.group(1)) / 100,
        sockets=Decimal(int(per_match) * _number(matches)),
        socket_bytes=Decimal(int(kib.group(1)) * 1024),
        files=Decimal(_number(files.group(1))) if files else None,
    )


def table_scaler() -> Obj:
    """The ScaledObject of the table replicas."""
    scaler: Obj = named(rendered("prod"), "ScaledObject", TABLE)["spec"]
    return scaler


def trigger(kind: str) -> Obj:
    """The table scaler's one trigger of that type."""
    found: list[Obj] = [t for t in table_scaler()["triggers"] if t["type"] == kind]
    assert len(found) == 1, kind
    return found[0]


def table_container() -> Obj:
    """The table's one container, as prod renders it."""
    deployment = named(rendered("prod"), "Deployment", TABLE)
    containers: list[Obj] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def targets(objs: tuple[Obj, ...]) -> list[tuple[str, str, str]]:
    """What every HPA and ScaledObject scales, as (apiVersion, kind, name)."""
    found = []
    for hpa in of_kind(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        found.append((ref["apiVersion"], ref["kind"], ref["name"]))
    for scaled in of_kind(objs, "ScaledObject"):
        ref = scaled["spec"]["scaleTargetRef"]  # KEDA's defaults: a Deployment of apps/v1
        found.append((ref.get("apiVersion", "apps/v1"), ref.get("kind", "Deployment"), ref["name"]))
    return found


def test_the_table_scales_on_cpu_and_on_sockets_as_before() -> None:
    scaler = table_scaler()
    assert scaler["scaleTargetRef"] == {"name": TABLE}
    assert {t["type"] for t in scaler["triggers"]} == {"cpu", "prometheus"}
    assert len(scaler["triggers"]) == 2
    assert (scaler["minReplicaCount"], scaler["maxReplicaCount"]) == (3, 12)
    hpa = scaler["advanced"]["horizontalPodAutoscalerConfig"]
    assert hpa["behavior"] == BEHAVIOR
    # KEDA's HPA keeps the plain HPA's name, and takes that HPA over on the first apply.
    assert hpa["name"] == TABLE
    annotations = named(rendered("prod"), "ScaledObject", TABLE)["metadata"]["annotations"]
    assert annotations["scaledobject.keda.sh/transfer-hpa-ownership"] == "true"


def test_the_cpu_target_is_the_capacity_sections_share_of_a_core_and_the_request() -> None:
    cores = capacity().cores
    cpu = trigger("cpu")
    resources = table_container()["resources"]
    request = quantity(resources["requests"]["cpu"])
    if cpu["metricType"] == "Utilization":  # a share of the request
        target = request * quantity(cpu["metadata"]["value"]) / 100
    else:
        assert cpu["metricType"] == "AverageValue"
        target = quantity(cpu["metadata"]["value"])
    assert target == cores, f"the scaler holds a replica at {target} cores, the runbook {cores}"
    # The scheduler reserves what a replica runs at: neither a third of it (nodes packed
    # with replicas that then starve each other) nor a core it never uses.
    assert request == target
    # The share is of the one core a Python process can use: the limit lets it get there
    # (bursting above the target while the scaler adds replicas).
    assert quantity(resources["limits"]["cpu"]) >= 1 > target


def socket_budget() -> Decimal:
    """The sockets one table replica can hold: the fewest of what the runbook counts, its
    memory limit at the runbook's cost of a socket with a quarter left for the process
    itself, and, where the runbook assumes a file limit, those files less the reserve the
    services keep for everything else they open (GIN_FILES_RESERVE)."""
    figures = capacity()
    container = table_container()
    limit = quantity(container["resources"]["limits"]["memory"])
    budget = min(figures.sockets, limit * Decimal("0.75") / figures.socket_bytes)
    if figures.files is not None:
        settings = Settings.from_env(_settings_of(rendered("prod"), container))
        reserve = getattr(settings, "files_reserve", 0)  # shared/infra/files.py keeps it
        assert figures.sockets < figures.files
        budget = min(budget, figures.files - reserve)
    return budget


def test_the_socket_target_leaves_a_replica_room_when_one_goes() -> None:
    budget = socket_budget()
    sockets = trigger("prometheus")
    # AverageValue: the replicas wanted are the sum over the table pods over the threshold.
    assert sockets.get("metricType", "AverageValue") == "AverageValue"
    threshold = quantity(sockets["metadata"]["threshold"])
    assert 0 < threshold < budget
    # When one replica of the fewest goes, the others take its sockets and still fit.
    fewest = table_scaler()["minReplicaCount"]
    assert threshold * fewest / (fewest - 1) <= budget, f"{threshold} a replica of {budget}"


def test_a_replica_refuses_sockets_before_its_memory_runs_out() -> None:
    """GIN_MAX_SOCKETS closes a replica's next socket with 1013 before its memory limit (an
    OOM kill would drop every player on it at once), and not before the scaler's target has
    room for a replica gone."""
    container = table_container()
    settings = Settings.from_env(_settings_of(rendered("prod"), container))
    threshold = quantity(trigger("prometheus")["metadata"]["threshold"])
    fewest = table_scaler()["minReplicaCount"]
    assert threshold * fewest / (fewest - 1) <= settings.max_sockets <= socket_budget()


def test_the_socket_query_sums_the_gauge_the_table_exports_over_its_pods() -> None:
    query = trigger("prometheus")["metadata"]["query"]
    (name,) = [m.name for m in SocketMetrics(CollectorRegistry(), 256).open_sockets.describe()]
    match = re.fullmatch(r"sum\((\w+)\{(.*)\}\)", query)
    assert match, query
    assert match.group(1) == name
    labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
    # The PodMonitor names each pod's service by its component label (gin_service); the
    # namespace keeps another overlay's pods, in a shared Prometheus, out of the sum.
    deployment = named(rendered("prod"), "Deployment", TABLE)
    assert labels == {"namespace": NAMESPACES["prod"], "gin_service": component(deployment)}


def test_the_socket_query_goes_to_the_prometheus_the_runbook_names() -> None:
    metadata = trigger("prometheus")["metadata"]
    address = urlsplit(metadata["serverAddress"])
    prerequisites = RUNBOOK.read_text().split("## Prerequisites", 1)[1].split("\n## ", 1)[0]
    where = re.search(r"kube-prometheus-stack \([^)]*\) in `([a-z0-9-]+)`", prerequisites)
    assert where, "the runbook names the namespace of kube-prometheus-stack"
    # prometheus-operated: the Service the operator makes for every Prometheus it runs.
    assert (address.scheme, address.hostname, address.port) == (
        "http",
        f"prometheus-operated.{where.group(1)}.svc",
        9090,
    )
    assert "authenticationRef" not in trigger("prometheus"), "that Prometheus asks none"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_deployment_has_two_autoscalers(overlay: str) -> None:
    objs = rendered(overlay)
    scaled = targets(objs)
    assert len(scaled) == len(set(scaled)), scaled
    deployments = {d["metadata"]["name"] for d in of_kind(objs, "Deployment")}
    for api_version, kind, name in scaled:
        assert (api_version, kind) == ("apps/v1", "Deployment")
        assert name in deployments, name


def test_the_bots_keep_their_scaler_and_the_scalers_own_the_replica_counts() -> None:
    objs = rendered("prod")
    bots = named(objs, "ScaledObject", "gin-bots")["spec"]
    assert bots["scaleTargetRef"]["name"] == "gin-bots"
    assert {t["type"] for t in bots["triggers"]} == {"rabbitmq"}
    kustomization = yaml.safe_load((K8S / "overlays" / "prod" / "kustomization.yaml").read_text())
    counted = {r["name"] for r in kustomization.get("replicas", [])}
    for _, _, name in targets(objs):
        assert name not in counted, f"{name}: every apply would undo its scaler"
        assert "replicas" not in named(objs, "Deployment", name)["spec"], name
    # KEDA's cpu trigger reads the containers' CPU requests.
    for container in named(objs, "Deployment", TABLE)["spec"]["template"]["spec"]["containers"]:
        assert "cpu" in container["resources"]["requests"], container["name"]
