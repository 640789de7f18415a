"""The Kubernetes manifests (deploy/k8s), rendered by ``kubectl kustomize`` as a deploy would.

Both overlays render; every object of a built-in kind passes kubernetes-validate's strict
schemas for Kubernetes 1.35 and 1.37 (the operators' kinds are checked against their CRDs in
test_operator_schemas.py); every workload has probes, resources, a non-root read-only
container and a grace period that covers its drain; every setting the code reads is set from a
ConfigMap or a Secret, and nothing stale is (no drift between shared/infra/settings.py and the
manifests); the NetworkPolicies let each service reach only what it uses; production scales
as the issue asks; the RabbitMQ topology is the one shared/infra/amqp.py declares, with
permissions that let only bots and timers write gin.commands and only bots read the bot
queues; every alert is in the runbook and every metric it reads is one the code exports.
"""

from __future__ import annotations

import asyncio
import functools
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from shared.contracts.names import (
    COMMANDS_EXCHANGE,
    COMMANDS_QUEUE,
    DEAD_LETTER,
    EVENTS_EXCHANGE,
    SOCKETS_EXCHANGE,
    bot_queue,
    chat_key,
    table_event_key,
    timer_key,
)
from shared.infra import amqp, tracing
from shared.infra.settings import Settings, env_name, env_names

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
RUNBOOK = ROOT / "deploy" / "README.md"
KUBECTL = shutil.which("kubectl")
# The oldest and the newest Kubernetes minor releases upstream supports (1.34's support ended
# in October 2026): an object must be valid on both, neither an API removed since nor a field
# added after. kubernetes-validate ships each release's schemas.
KUBERNETES_VERSIONS = ("1.35", "1.37")
KUBERNETES_VERSION = KUBERNETES_VERSIONS[0]
OVERLAYS = ("dev", "prod")
NAMESPACES = {"dev": "gin-dev", "prod": "gin"}
# The API groups of the custom resources (operators' CRDs): kubernetes-validate has no schema
# for them. Anything else without a schema is a mistake (a built-in kind misspelt).
CUSTOM_GROUPS = {
    "postgresql.cnpg.io",
    "barmancloud.cnpg.io",
    "rabbitmq.com",
    "keda.sh",
    "monitoring.coreos.com",
}
SERVICES = ("table", "chat", "timers", "bots")
# The table's outbox relay (services.table.relay, GIN_RELAY_APART on the replicas) is a
# workload of its own, scraped only.
PORTS = {"table": 8080, "chat": 8081, "timers": 8082, "bots": 8083, "table.relay": 8084}
SECRET_SETTINGS = {env_name(f) for f in ("database_url", "amqp_url", "auth_secret")}
# Settings a workload is deliberately not given (least privilege), by app.kubernetes.io/component.
NOT_GIVEN = {
    "bots": {env_name("database_url"), env_name("auth_secret")},  # no database, no tokens
    "timers": {env_name("auth_secret")},  # verifies no tokens
    "table.relay": {env_name("auth_secret")},  # publishes only
    "migrations": {env_name("amqp_url"), env_name("auth_secret"), env_name("http_port")},
}
# What each workload may reach: (the server's gin.selminha.com/server label, port).
REACHES = {
    "table": {("postgresql", 5432), ("rabbitmq", 5672)},
    "chat": {("postgresql", 5432), ("rabbitmq", 5672)},
    "timers": {("postgresql", 5432), ("rabbitmq", 5672)},
    "table.relay": {("postgresql", 5432), ("rabbitmq", 5672)},
    "bots": {("rabbitmq", 5672)},
    "migrations": {("postgresql", 5432)},
}
Obj = dict[str, Any]


# --- rendering ---------------------------------------------------------------------------------


@functools.cache
def _render(overlay: str) -> tuple[Obj, ...]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    """Each overlay's name."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: it renders the kustomize overlays")
    name: str = request.param
    return name


def rendered(overlay: str) -> tuple[Obj, ...]:
    """The objects ``kubectl kustomize`` makes of an overlay."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: it renders the kustomize overlays")
    return _render(overlay)


def of_kind(objs: tuple[Obj, ...], kind: str) -> list[Obj]:
    """The objects of one kind."""
    return [o for o in objs if o["kind"] == kind]


def named(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    """The one object of a kind with that name."""
    found = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def component(obj: Obj) -> str:
    """A workload's app.kubernetes.io/component."""
    value: str = obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    return value


def workloads(objs: tuple[Obj, ...]) -> list[Obj]:
    """The Deployments and Jobs of the services (not the servers)."""
    return of_kind(objs, "Deployment") + of_kind(objs, "Job")


def containers(workload: Obj) -> list[Obj]:
    """A pod template's containers, init containers first."""
    spec = workload["spec"]["template"]["spec"]
    found: list[Obj] = spec.get("initContainers", []) + spec["containers"]
    return found


# --- rendering and validation ------------------------------------------------------------------


def test_overlays_render_every_service(overlay: str) -> None:
    objs = rendered(overlay)
    namespace = NAMESPACES[overlay]
    for obj in objs:
        assert obj["metadata"]["name"]
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]
    for service in SERVICES:
        for kind in ("Deployment", "Service", "ServiceAccount"):
            named(objs, kind, f"gin-{service}")
    job = named(objs, "Job", "gin-migrate")
    assert [c["args"] for c in containers(job)] == [
        ["services.table", "migrate"],
        ["services.chat", "migrate"],
        ["services.timers", "migrate"],
    ]


def test_builtin_kinds_pass_strict_validation(overlay: str) -> None:
    errors: list[str] = []
    validated = 0
    for obj in rendered(overlay):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
            validated += 1
        except kubernetes_validate.SchemaNotFoundError:
            group = obj["apiVersion"].split("/")[0]
            if group not in CUSTOM_GROUPS:
                errors.append(f"{where}: no schema for {obj['apiVersion']} (a misspelt kind?)")
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{where}: {path}: {exc.message}")
    assert not errors, "\n".join(errors)
    assert validated >= 30


# --- workloads ---------------------------------------------------------------------------------


def _sleep_seconds(container: Obj) -> int:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


def _settings_of(objs: tuple[Obj, ...], container: Obj) -> dict[str, str]:
    """The values of a container's ConfigMap-sourced settings."""
    values: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, source
        values.update(named(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
    return values


def test_every_workload_is_hardened(overlay: str) -> None:
    objs = rendered(overlay)
    pod_kinds = ("Deployment", "Job", "StatefulSet")
    for workload in [o for o in objs if o["kind"] in pod_kinds]:
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert pod["automountServiceAccountToken"] is False, where
        named(objs, "ServiceAccount", pod["serviceAccountName"])
        for container in containers(workload):
            resources = container["resources"]
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[part]), f"{where}: {part}"
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            assert security.get("runAsNonRoot", True) is True, where
            if workload["kind"] != "StatefulSet":  # the servers of dev write where they like
                assert security["readOnlyRootFilesystem"] is True, where
                assert "command" not in container, f"{where}: the image's entrypoint runs it"
                assert container["args"][0].startswith("services."), where


def test_every_deployment_has_probes_and_drains(overlay: str) -> None:
    objs = rendered(overlay)
    for deployment in of_kind(objs, "Deployment"):
        where = deployment["metadata"]["name"]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        service = component(deployment)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"http": PORTS[service]}, where
        assert container["args"] == [f"services.{service}"], where
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert container[probe]["httpGet"] == {"path": path, "port": "http"}, where
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz", where
        settings = Settings.from_env(_settings_of(objs, container))
        assert settings.http_port == PORTS[service], where
        assert settings.http_host == "0.0.0.0", f"{where}: a pod must listen beyond loopback"
        # The endpoints drop the pod during the preStop pause; then SIGTERM: the service
        # closes its WebSockets (1001) and finishes within GIN_SHUTDOWN_GRACE_S.
        drain = _sleep_seconds(container) + settings.shutdown_grace_s + 5
        assert pod["terminationGracePeriodSeconds"] >= drain, where
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", where
        assert annotations["prometheus.io/port"] == str(PORTS[service]), where
        assert annotations["prometheus.io/path"] == "/metrics", where
        service_obj = named(objs, "Service", deployment["metadata"]["name"])
        assert service_obj["spec"]["selector"].items() <= _pod_labels(deployment).items()
        assert service_obj["spec"]["ports"][0]["targetPort"] == "http", where


def _pod_labels(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


# --- settings: no drift between the code and the manifests ------------------------------------


def _given(objs: tuple[Obj, ...], container: Obj) -> tuple[set[str], set[str], set[str]]:
    """The GIN_* settings a container gets: from ConfigMaps, from Secrets, as literal values."""
    from_maps = set(_settings_of(objs, container))
    from_secrets: set[str] = set()
    literal: set[str] = set()
    for var in container.get("env", []):
        if "secretKeyRef" in var.get("valueFrom", {}):
            from_secrets.add(var["name"])
        else:
            literal.add(var["name"])
    return from_maps, from_secrets, literal


def test_every_setting_is_set_from_a_configmap_or_a_secret(overlay: str) -> None:
    objs = rendered(overlay)
    read_by_code = set(env_names()) | set(tracing.ENV_NAMES)
    for workload in workloads(objs):
        kind = component(workload)
        for container in containers(workload):
            where = f"{workload['metadata']['name']}/{container['name']}"
            from_maps, from_secrets, literal = _given(objs, container)
            assert not literal, f"{where}: settings belong in a ConfigMap or a Secret: {literal}"
            assert not from_maps & from_secrets, f"{where}: set twice"
            given = from_maps | from_secrets
            assert not given - read_by_code, f"{where}: stale settings {given - read_by_code}"
            missing = read_by_code - given - NOT_GIVEN.get(kind, set())
            assert not missing, f"{where}: settings the code reads are not set: {missing}"
            assert not given & NOT_GIVEN.get(kind, set()), f"{where}: given what it needs not"
            assert from_secrets == SECRET_SETTINGS - NOT_GIVEN.get(kind, set()), where
            Settings.from_env(_settings_of(objs, container))  # every value has the right type


@pytest.mark.parametrize(
    ("service", "variable"),
    sorted((s, v) for s in SERVICES for v in NOT_GIVEN.get(s, set())),
)
def test_settings_not_given_are_not_read(service: str, variable: str) -> None:
    attribute = "." + variable.removeprefix("GIN_").lower()  # settings.database_url
    for path in (ROOT / "services" / service).rglob("*.py"):
        assert attribute not in path.read_text(), f"{path} reads {variable}: give it"


def test_dev_secrets_exist_with_their_keys() -> None:
    objs = rendered("dev")
    secrets = {s["metadata"]["name"]: s for s in of_kind(objs, "Secret")}
    for workload in [o for o in objs if "template" in o.get("spec", {})]:
        for container in containers(workload):
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["key"] in secrets[ref["name"]]["data"], ref


def test_prod_secrets_are_in_the_runbook() -> None:
    objs = rendered("prod")
    needed = {"gin-keda-rabbitmq"}
    for workload in workloads(objs):
        for container in containers(workload):
            for var in container.get("env", []):
                needed.add(var["valueFrom"]["secretKeyRef"]["name"])
    needed |= {u["spec"]["importCredentialsSecret"]["name"] for u in of_kind(objs, "User")}
    cluster = named(objs, "Cluster", "gin-postgres")["spec"]
    needed.add(cluster["bootstrap"]["initdb"]["secret"]["name"])
    needed |= {r["passwordSecret"]["name"] for r in cluster["managed"]["roles"]}
    (store,) = of_kind(objs, "ObjectStore")
    credentials = store["spec"]["configuration"]["s3Credentials"]
    needed |= {ref["name"] for ref in credentials.values()}
    assert not of_kind(objs, "Secret"), "production Secrets are never in git"
    runbook = RUNBOOK.read_text()
    assert not {s for s in needed if f"`{s}`" not in runbook}, "deploy/README.md, Secrets"
    assert len(needed) == 11


# --- network policies --------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    """A pod as the NetworkPolicies see it."""

    name: str
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, values = expr["key"], expr.get("values", [])
        has = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[expr["operator"]]
        if not has:
            return False
    return True


def _peer(peer: Obj, pod: Pod, policy_namespace: str) -> bool:
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": pod.namespace}
        if not _selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif pod.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or _selects(peer["podSelector"], pod.labels)


def _port(rule: Obj, target: Pod, port: int) -> bool:
    if not rule.get("ports"):
        return True
    for entry in rule["ports"]:
        wanted = entry["port"]
        if entry.get("protocol", "TCP") == "TCP" and port == target.ports.get(wanted, wanted):
            return True
    return False


def _allowed(policies: list[Obj], direction: str, subject: Pod, other: Pod, port: int) -> bool:
    """Whether the policies of ``subject`` let traffic to (egress) or from (ingress) ``other``."""
    target = other if direction == "Egress" else subject
    peers_key = "to" if direction == "Egress" else "from"
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == subject.namespace
        and _selects(p["spec"]["podSelector"], subject.labels)
        and direction in p["spec"]["policyTypes"]
    ]
    if not selecting:
        return True  # not isolated
    for policy in selecting:
        for rule in policy["spec"].get(direction.lower(), []) or []:
            peers = rule.get(peers_key)
            ns = policy["metadata"]["namespace"]
            if (not peers or any(_peer(p, other, ns) for p in peers)) and _port(rule, target, port):
                return True
    return False


def reachable(policies: list[Obj], source: Pod, target: Pod, port: int) -> bool:
    """Whether ``source`` may open a TCP connection to ``target`` on ``port``."""
    return _allowed(policies, "Egress", source, target, port) and _allowed(
        policies, "Ingress", target, source, port
    )


def _pods(objs: tuple[Obj, ...], namespace: str) -> list[Pod]:
    pods = []
    for workload in [o for o in objs if o["kind"] in ("Deployment", "Job", "StatefulSet")]:
        ports = {
            p["name"]: p["containerPort"] for c in containers(workload) for p in c.get("ports", [])
        }
        pods.append(Pod(workload["metadata"]["name"], namespace, _pod_labels(workload), ports))
    for cluster in of_kind(objs, "Cluster"):  # CloudNativePG
        labels = {**cluster["spec"]["inheritedMetadata"]["labels"]}
        labels["cnpg.io/cluster"] = cluster["metadata"]["name"]
        pods.append(Pod(cluster["metadata"]["name"], namespace, labels, {"postgresql": 5432}))
    for cluster in of_kind(objs, "RabbitmqCluster"):
        override = cluster["spec"]["override"]["statefulSet"]["spec"]["template"]
        labels = {**override["metadata"]["labels"]}
        labels["app.kubernetes.io/name"] = cluster["metadata"]["name"]
        ports = {"amqp": 5672, "management": 15672, "prometheus": 15692}
        pods.append(Pod(cluster["metadata"]["name"], namespace, labels, ports))
    return pods


def test_each_service_reaches_only_what_it_uses(overlay: str) -> None:
    objs = rendered(overlay)
    policies = of_kind(objs, "NetworkPolicy")
    pods = _pods(objs, NAMESPACES[overlay])
    servers = [p for p in pods if "gin.selminha.com/server" in p.labels]
    assert {s.labels["gin.selminha.com/server"] for s in servers} == {"postgresql", "rabbitmq"}
    for workload in workloads(objs):
        source = next(p for p in pods if p.name == workload["metadata"]["name"])
        reached = {
            (server.labels["gin.selminha.com/server"], port)
            for server in servers
            for port in server.ports.values()
            if reachable(policies, source, server, port)
        }
        assert reached == REACHES[component(workload)], source.name
        dns = Pod("coredns", "kube-system", {"k8s-app": "kube-dns"})
        assert reachable(policies, source, dns, 53), f"{source.name}: DNS"
        internet = Pod("elsewhere", "elsewhere", {})
        assert not reachable(policies, source, internet, 443), f"{source.name}: egress is open"


def test_who_reaches_the_services(overlay: str) -> None:
    objs = rendered(overlay)
    policies = of_kind(objs, "NetworkPolicy")
    pods = {p.name: p for p in _pods(objs, NAMESPACES[overlay])}
    stranger = Pod("stranger", NAMESPACES[overlay], {})  # e.g. the ingress controller's peer
    prometheus = Pod("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"})
    for service in PORTS:
        pod = pods[f"gin-{service.replace('.', '-')}"]
        port = PORTS[service]
        assert reachable(policies, prometheus, pod, port), service
        assert reachable(policies, stranger, pod, port) == (service in ("table", "chat"))
        assert not reachable(policies, stranger, pod, 9999), service
    for server in [p for p in pods.values() if "gin.selminha.com/server" in p.labels]:
        for port in server.ports.values():
            assert not reachable(policies, stranger, server, port), server.name


# --- production: replicas, autoscaling, disruption budgets, servers ---------------------------


def test_prod_scales_as_asked() -> None:
    objs = rendered("prod")
    assert "replicas" not in named(objs, "Deployment", "gin-table")["spec"], "KEDA owns it"
    assert "replicas" not in named(objs, "Deployment", "gin-bots")["spec"], "KEDA owns it"
    assert named(objs, "Deployment", "gin-chat")["spec"]["replicas"] == 2
    assert named(objs, "Deployment", "gin-timers")["spec"]["replicas"] == 2
    assert named(objs, "Deployment", "gin-table-relay")["spec"]["replicas"] == 2
    table = named(objs, "ScaledObject", "gin-table")["spec"]  # tests/deploy/test_scaling.py
    assert table["scaleTargetRef"] == {"name": "gin-table"}
    assert table["minReplicaCount"] >= 3
    assert table["maxReplicaCount"] > table["minReplicaCount"]
    scaled = named(objs, "ScaledObject", "gin-bots")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "gin-bots"
    assert scaled["minReplicaCount"] >= 1
    queues = {t["metadata"]["queueName"] for t in scaled["triggers"] if t["type"] == "rabbitmq"}
    assert queues == {bot_queue(level) for level in amqp.BOT_LEVELS}
    for trigger in scaled["triggers"]:
        auth = named(objs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert auth["spec"]["secretTargetRef"][0]["parameter"] == "host"
    budgets = of_kind(objs, "PodDisruptionBudget")
    for deployment in of_kind(objs, "Deployment"):
        covering = [b for b in budgets if _selects(b["spec"]["selector"], _pod_labels(deployment))]
        assert len(covering) == 1, deployment["metadata"]["name"]
    assert named(objs, "Cluster", "gin-postgres")["spec"]["instances"] == 3
    assert named(objs, "RabbitmqCluster", "gin-rabbitmq")["spec"]["replicas"] == 3


def test_prod_mints_no_tokens() -> None:
    objs = rendered("prod")
    for deployment in of_kind(objs, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        settings = Settings.from_env(_settings_of(objs, container))
        assert settings.dev_tokens is False, "POST /v1/dev/tokens must not exist in production"
        assert settings.log_format == "json"
        assert settings.prefix == "", "the topology objects name the exchanges unprefixed"


def test_dev_runs_one_of_each_with_single_node_servers() -> None:
    objs = rendered("dev")
    for deployment in of_kind(objs, "Deployment"):
        assert deployment["spec"]["replicas"] == 1, deployment["metadata"]["name"]
    sets = {s["metadata"]["name"]: s["spec"] for s in of_kind(objs, "StatefulSet")}
    assert set(sets) == {"gin-postgres", "gin-rabbitmq"}
    for spec in sets.values():
        assert spec["replicas"] == 1
        assert spec["volumeClaimTemplates"], "persistent volumes"
    assert not [o for o in objs if o["apiVersion"].split("/")[0] in CUSTOM_GROUPS]


# --- RabbitMQ topology and permissions (prod) --------------------------------------------------


@dataclass
class _Recorded:
    """What ``amqp.declare_topology`` declares, recorded by a stand-in channel."""

    exchanges: dict[str, str] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    bindings: set[tuple[str, str, str]] = field(default_factory=set)
    referenced: set[str] = field(default_factory=set)  # exchanges used, not declared


@dataclass
class _Exchange:
    name: str


@dataclass
class _Queue:
    name: str
    recorded: _Recorded

    async def bind(self, exchange: _Exchange, routing_key: str | None = None) -> None:
        # aio-pika binds with the queue's name when given no routing key.
        self.recorded.bindings.add((exchange.name, self.name, routing_key or self.name))


@dataclass
class _Channel:
    recorded: _Recorded

    async def declare_exchange(self, name: str, type: Any, durable: bool = False) -> _Exchange:
        assert durable
        self.recorded.exchanges[name] = type.value
        return _Exchange(name)

    async def declare_queue(
        self, name: str, durable: bool = False, arguments: dict[str, Any] | None = None
    ) -> _Queue:
        assert durable
        self.recorded.queues[name] = dict(arguments or {})
        return _Queue(name, self.recorded)

    async def get_exchange(self, name: str, ensure: bool = True) -> _Exchange:
        assert not ensure, "a reference, not a declaration"
        self.recorded.referenced.add(name)
        return _Exchange(name)


@functools.cache
def declared_topology(service: str | None = None) -> _Recorded:
    """The exchanges, queues and bindings a service declares at start (no prefix); all of
    them, as the tests and the operator declare them, when ``service`` is None."""
    recorded = _Recorded()
    asyncio.run(amqp.declare_topology(_Channel(recorded), "", service))  # type: ignore[arg-type]
    return recorded


def test_prod_topology_is_what_the_code_declares() -> None:
    objs = rendered("prod")
    topology = declared_topology()
    vhosts = {v["spec"]["name"] for v in of_kind(objs, "Vhost")}
    assert vhosts == {"gin"}
    for obj in [o for o in objs if o["apiVersion"].startswith("rabbitmq.com/")]:
        if obj["kind"] != "RabbitmqCluster":
            assert obj["spec"]["rabbitmqClusterReference"] == {"name": "gin-rabbitmq"}
        if obj["kind"] not in ("RabbitmqCluster", "Vhost", "User"):
            assert obj["spec"]["vhost"] == "gin", obj["metadata"]["name"]
    exchanges = {e["spec"]["name"]: e["spec"] for e in of_kind(objs, "Exchange")}
    assert {n: e["type"] for n, e in exchanges.items()} == topology.exchanges
    assert all(e["durable"] and not e["autoDelete"] for e in exchanges.values())
    queues: dict[str, dict[str, Any]] = {}
    for queue in of_kind(objs, "Queue"):
        spec = queue["spec"]
        assert spec["durable"]
        assert not spec["autoDelete"]
        arguments = dict(spec.get("arguments", {}))
        if "type" in spec:
            arguments["x-queue-type"] = spec["type"]
        queues[spec["name"]] = arguments
    # Exactly the same arguments, or the services' own declarations fail (PRECONDITION_FAILED).
    assert queues == topology.queues
    assert queues[COMMANDS_QUEUE]["x-queue-type"] == "quorum"
    bindings = {
        (b["spec"]["source"], b["spec"]["destination"], b["spec"]["routingKey"])
        for b in of_kind(objs, "Binding")
    }
    assert all(b["spec"]["destinationType"] == "queue" for b in of_kind(objs, "Binding"))
    assert bindings == topology.bindings


def _can(pattern: str, name: str) -> bool:
    # RabbitMQ searches (unanchored); an empty pattern grants nothing.
    return pattern != "" and re.search(pattern, name) is not None


def _permissions(objs: tuple[Obj, ...]) -> dict[str, dict[str, str]]:
    found = {p["spec"]["userReference"]["name"]: p["spec"] for p in of_kind(objs, "Permission")}
    assert all(p["vhost"] == "gin" for p in found.values())
    return {user: spec["permissions"] for user, spec in found.items()}


def _needs(service: str) -> set[tuple[str, str]]:
    """(permission, resource) for everything a service does on the broker, per its code."""
    from services.chat.consumer import CHAT_QUEUE

    topology = declared_topology(service)
    needs = {("configure", n) for n in [*topology.exchanges, *topology.queues]}
    for source, destination, _ in topology.bindings:
        needs |= {("read", source), ("write", destination)}
    for arguments in topology.queues.values():  # declaring a queue that dead-letters
        if "x-dead-letter-exchange" in arguments:
            needs.add(("write", arguments["x-dead-letter-exchange"]))
    own = {"table": f"{SOCKETS_EXCHANGE}.{'0' * 32}", "chat": CHAT_QUEUE}
    if service in own:  # its own queue of table events: declare, bind, consume
        queue = own[service]
        needs |= {(what, queue) for what in ("configure", "write", "read")}
        needs.add(("read", EVENTS_EXCHANGE))
    if service == "chat":  # its queue dead-letters to gin.dead
        needs.add(("write", DEAD_LETTER))
    if service == "table":  # the replicas' queues also get the relay's batches
        needs |= {("read", SOCKETS_EXCHANGE)}
    publishes = {
        "table": {EVENTS_EXCHANGE, "gin.bots", SOCKETS_EXCHANGE},
        "chat": {EVENTS_EXCHANGE},
        "timers": {EVENTS_EXCHANGE, COMMANDS_EXCHANGE},  # expire commands to gin.commands
        "bots": {COMMANDS_EXCHANGE},  # moves to gin.commands
    }[service]
    assert topology.referenced <= publishes
    needs |= {("write", e) for e in publishes}
    consumes = {
        "table": {COMMANDS_QUEUE},
        "bots": {bot_queue(level) for level in amqp.BOT_LEVELS},
    }.get(service, set())
    return needs | {("read", q) for q in consumes}


def test_each_broker_user_may_do_what_its_service_does() -> None:
    permissions = _permissions(rendered("prod"))
    for service in SERVICES:
        granted = permissions[f"gin-{service}"]
        refused = {(p, r) for p, r in _needs(service) if not _can(granted[p], r)}
        assert not refused, f"gin-{service} is refused {refused}"


def test_each_user_may_do_only_what_its_service_does() -> None:
    """Nothing granted beyond what the code needs, on every name the topology has."""
    from services.chat.consumer import CHAT_QUEUE
    from shared.contracts.names import TIMERS_QUEUE  # the timers' former queue: nobody's now

    permissions = _permissions(rendered("prod"))
    topology = declared_topology()
    names = {*topology.exchanges, *topology.queues, CHAT_QUEUE, TIMERS_QUEUE, "amq.default"}
    names |= {f"{SOCKETS_EXCHANGE}.{'0' * 32}", "gin.stolen", "amq.gen-Xy12"}
    for service in SERVICES:
        needs = _needs(service)
        granted = permissions[f"gin-{service}"]
        for what in ("configure", "write", "read"):
            extra = {n for n in names if _can(granted[what], n) and (what, n) not in needs}
            assert not extra, f"gin-{service} may {what} {extra} without needing it"


def test_only_bots_and_timers_write_commands_only_bots_read_bot_queues() -> None:
    permissions = _permissions(rendered("prod"))

    def who(permission: str, resource: str) -> set[str]:
        return {u for u, p in permissions.items() if _can(p[permission], resource)}

    # The default exchange would let its writers write any queue: nobody may.
    assert who("write", "amq.default") == set()
    assert who("write", COMMANDS_EXCHANGE) == {"gin-bots", "gin-timers"}
    assert who("read", COMMANDS_QUEUE) == {"gin-table"}
    assert who("write", COMMANDS_QUEUE) == {"gin-table"}  # its binding to gin.commands.in
    for level in amqp.BOT_LEVELS:
        assert who("read", bot_queue(level)) == {"gin-bots"}
    assert who("read", "gin.bots") == {"gin-bots"}  # nobody else may bind a queue to it
    assert who("write", "gin.bots") == {"gin-table"}
    assert who("read", DEAD_LETTER) == {"gin-table"}
    assert who("write", SOCKETS_EXCHANGE) == who("read", SOCKETS_EXCHANGE) == {"gin-table"}
    assert permissions["gin-keda"] == {"configure": "", "write": "", "read": ""}
    for user in permissions:  # nobody may make or take from queues named at random
        assert not _can(permissions[user]["read"], "gin.stolen"), user
        assert not _can(permissions[user]["configure"], "amq.gen-Xy12"), user


def test_each_publisher_uses_only_its_own_routing_keys() -> None:
    objs = rendered("prod")
    topics = {
        t["spec"]["userReference"]["name"]: t["spec"]["permissions"]
        for t in of_kind(objs, "TopicPermission")
    }
    keys = {
        "gin-table": table_event_key("t1", "card_drawn"),
        "gin-chat": chat_key("t1"),
        "gin-timers": timer_key("t1", "absence_claimable"),
    }
    writers = {u for u, p in _permissions(objs).items() if _can(p["write"], EVENTS_EXCHANGE)}
    assert writers == set(keys) == set(topics)
    for user, topic in topics.items():
        assert topic["exchange"] == EVENTS_EXCHANGE
        allowed = {u for u, key in keys.items() if _can(topic["write"], key)}
        assert allowed == {user}, user
        assert _can(topic["read"], table_event_key("*", "seat_taken"))
    # every timer event, the turn reminders too (issue 33)
    assert _can(topics["gin-timers"]["write"], timer_key("t1", "turn_reminder"))


def test_each_service_connects_as_its_own_broker_user() -> None:
    objs = rendered("prod")
    users = {u["metadata"]["name"]: u["spec"] for u in of_kind(objs, "User")}
    for service in SERVICES:
        (container,) = named(objs, "Deployment", f"gin-{service}")["spec"]["template"]["spec"][
            "containers"
        ]
        url = next(v for v in container["env"] if v["name"] == env_name("amqp_url"))
        secret = url["valueFrom"]["secretKeyRef"]["name"]
        assert users[f"gin-{service}"]["importCredentialsSecret"]["name"] == secret
        assert not users[f"gin-{service}"].get("tags"), "no management access"
    assert users["gin-keda"]["tags"] == ["monitoring"]
    # The table's outbox relay is the table's code: the table's user and role.
    (relay,) = named(objs, "Deployment", "gin-table-relay")["spec"]["template"]["spec"][
        "containers"
    ]
    secrets = {v["name"]: v["valueFrom"]["secretKeyRef"]["name"] for v in relay["env"]}
    assert secrets == {
        env_name("database_url"): "gin-table-database",
        env_name("amqp_url"): "gin-table-amqp",
    }


# --- monitoring --------------------------------------------------------------------------------


SUFFIXES = {
    "Counter": ("_total",),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count"),
    "Summary": ("_sum", "_count"),
}


@functools.cache
def _collectors() -> dict[str, str]:
    """Every gin_* collector the code makes: its name and kind (Counter, Gauge, ...)."""
    pattern = re.compile(r'\b(Counter|Gauge|Histogram|Summary)\(\s*"(gin_\w+)"')
    found: dict[str, str] = {}
    for directory in ("shared", "services"):
        for path in (ROOT / directory).rglob("*.py"):
            found.update((name, kind) for kind, name in pattern.findall(path.read_text()))
    return found


def _exported_metrics() -> set[str]:
    """Every gin_* series name the code's collectors expose."""
    return {name + s for name, kind in _collectors().items() for s in SUFFIXES[kind]}


def _alerts(objs: tuple[Obj, ...]) -> Iterator[Obj]:
    for rules in of_kind(objs, "PrometheusRule"):
        for group in rules["spec"]["groups"]:
            yield from group["rules"]


def test_every_alert_is_explained_and_reads_real_metrics() -> None:
    objs = rendered("prod")
    exported = _exported_metrics()
    assert "gin_outbox_lag_seconds" in exported
    runbook = RUNBOOK.read_text()
    alerts = list(_alerts(objs))
    assert len(alerts) >= 25
    for alert in alerts:
        name = alert["alert"]
        assert f"### {name}" in runbook, f"deploy/README.md explains no {name}"
        # The page (Alertmanager, its receiver) links to the section: GitHub's anchor of it.
        anchor = f"deploy/README.md#{name.lower()}"
        assert alert["annotations"]["description"].endswith(anchor), name
        assert alert["labels"]["severity"] in ("warning", "critical"), name
        assert re.fullmatch(r"\d+m", alert["for"]), name
        used = set(re.findall(r"\bgin_\w+", alert["expr"])) - {"gin_service"}
        assert used <= exported, f"{name} reads metrics nobody exports: {used - exported}"
        assert 'outcome="refused"' not in alert["expr"], "refusals are normal game flow"
    documented = set(re.findall(r"^### (Gin\w+)", runbook, flags=re.MULTILINE))
    assert documented == {a["alert"] for a in alerts}, "stale alerts in the runbook"


def test_every_metric_is_in_the_runbook() -> None:
    runbook = RUNBOOK.read_text()
    collectors = _collectors()
    assert len(collectors) >= 10
    for name, kind in collectors.items():
        shown = name + "_total" if kind == "Counter" else name
        assert f"`{shown}" in runbook, f"deploy/README.md, Read the metrics: {shown}"


def test_prometheus_scrapes_every_service() -> None:
    objs = rendered("prod")
    monitor = named(objs, "PodMonitor", "gin-services")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["http"]
    for deployment in of_kind(objs, "Deployment"):
        assert _selects(monitor["spec"]["selector"], _pod_labels(deployment))


def test_prometheus_scrapes_postgres_through_a_podmonitor_of_its_own() -> None:
    """CloudNativePG's monitoring.enablePodMonitor is deprecated: the overlay has its own,
    selecting the Cluster's instances (labelled cnpg.io/cluster) on their exporter's port."""
    objs = rendered("prod")
    cluster = named(objs, "Cluster", "gin-postgres")
    assert "enablePodMonitor" not in cluster["spec"].get("monitoring", {})
    monitor = named(objs, "PodMonitor", "gin-postgres")
    instance = {"cnpg.io/cluster": cluster["metadata"]["name"]}
    assert _selects(monitor["spec"]["selector"], instance)
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


# --- the image ---------------------------------------------------------------------------------


def test_dockerfile_runs_any_service_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, flags=re.MULTILINE)) == 2, "multi-stage"
    assert re.search(r"^USER 10001", text, flags=re.MULTILINE)
    assert 'ENTRYPOINT ["python", "-m"]' in text
    assert text.rstrip().endswith('CMD ["services.table"]')
    pod = named(rendered("dev"), "Deployment", "gin-table")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001


def test_the_wheel_ships_the_migrations() -> None:
    # The image installs the project's wheel; without the .sql files as package data the
    # migrations Job would apply nothing and the services would find no tables.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = project["tool"]["setuptools"].get("package-data", {})
    assert any("*.sql" in patterns for patterns in package_data.values()), (
        'pyproject.toml needs [tool.setuptools.package-data] "*" = ["*.sql"]'
    )


def test_prod_names_the_tokens_issuer_and_audience_and_refuses_others() -> None:
    """Issue 31, part 6: production checks ``iss`` and ``aud``, so a token the site signed
    for another of its services (same secret) is refused, and the site's own passes."""
    import jwt

    from shared.infra.auth import AuthError, Verifier

    objs = rendered("prod")
    data = _settings_of(objs, containers(named(objs, "Deployment", "gin-table"))[0])
    chat = _settings_of(objs, containers(named(objs, "Deployment", "gin-chat"))[0])
    names = ("GIN_AUTH_ISSUER", "GIN_AUTH_AUDIENCE")
    assert [chat[n] for n in names] == [data[n] for n in names]  # both check tokens
    issuer, audience = data["GIN_AUTH_ISSUER"], data["GIN_AUTH_AUDIENCE"]
    assert issuer.startswith("https://")
    assert audience
    secret = "a-secret-of-more-than-32-bytes-for-the-test"
    verifier = Verifier(secret, issuer=issuer, audience=audience)

    def token(**claims: Any) -> str:
        return jwt.encode({"sub": "ana", "exp": 2_000_000_000, **claims}, secret, "HS256")

    assert verifier.verify(token(iss=issuer, aud=audience)).id == "ana"
    assert verifier.verify(token(iss=issuer, aud=["chat-elsewhere", audience])).id == "ana"
    for other in (
        token(iss=issuer, aud="another-service"),
        token(iss="https://elsewhere.example", aud=audience),
        token(aud=audience),
        token(iss=issuer),
    ):
        with pytest.raises(AuthError):
            verifier.verify(other)
