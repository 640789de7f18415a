"""deploy/k8s/components/subscriber (issue 15, part 6): what another team's service gets when it
adds the component with its name, rendered by ``kubectl kustomize`` as a deploy would.

Its user may declare, bind and read only its own queues, bind only on gin.events and write no
exchange; its quorum queue dead-letters to its own exchange and queue; the binding is the key
it asked for; its pods (labelled, in its namespace) reach RabbitMQ's AMQP port and nothing else
of it, and no other pod gets in by its policy. Two teams' objects never collide.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from shared.contracts.names import COMMANDS_QUEUE, EVENTS_EXCHANGE, HISTORY_STREAM, bot_queue
from tests.deploy.test_manifests import (
    CUSTOM_GROUPS,
    K8S,
    KUBERNETES_VERSION,
    Obj,
    Pod,
    _can,
    _pods,
    of_kind,
    reachable,
    rendered,
)

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the kustomizations")
COMPONENT = K8S / "components" / "subscriber"
HISTORY = K8S / "components" / "subscriber-history"


def render(directory: Path) -> tuple[Obj, ...]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def team(
    tmp_path: Path, name: str, namespace: str, routing_key: str, history: bool = False
) -> tuple[Obj, ...]:
    """What a team's own kustomization renders, made as docs/subscribing.md says (with the
    history stream's opt-in component if ``history``)."""
    directory = tmp_path / name
    directory.mkdir()
    components = [COMPONENT, HISTORY] if history else [COMPONENT]
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "gin",
                "resources": ["subscriber.yaml"],
                "components": [os.path.relpath(c, directory) for c in components],
            }
        )
    )
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gin-subscriber",
            "annotations": {"config.kubernetes.io/local-config": "true"},
        },
        "data": {"name": name, "namespace": namespace, "routing_key": routing_key},
    }
    (directory / "subscriber.yaml").write_text(yaml.safe_dump(config))
    return render(directory)


def one(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    found = [o for o in of_kind(objs, kind) if o["spec"].get("name", o["metadata"]["name"]) == name]
    assert len(found) == 1, (kind, name, found)
    return found[0]


def test_the_example_renders_and_validates() -> None:
    objs = render(K8S / "subscribers" / "notifier")
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == [
        "Binding",
        "Binding",
        "Exchange",
        "NetworkPolicy",
        "Permission",
        "Queue",
        "Queue",
        "User",
    ]
    assert "NAME" not in yaml.safe_dump_all(objs)  # every placeholder replaced
    assert not of_kind(objs, "ConfigMap")  # local-config: names things, is not applied
    for obj in objs:
        assert obj["metadata"]["namespace"] == "gin"
        assert obj["metadata"]["name"].startswith("gin-sub-notifier")
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert obj["apiVersion"].split("/")[0] in CUSTOM_GROUPS
        if obj["apiVersion"].startswith("rabbitmq.com/"):
            assert obj["spec"]["rabbitmqClusterReference"] == {"name": "gin-rabbitmq"}
            if obj["kind"] != "User":
                assert obj["spec"]["vhost"] == "gin"


@pytest.mark.parametrize("name", ["notifier", "your-turn"])
def test_queue_dead_letters_and_binding(tmp_path: Path, name: str) -> None:
    objs = team(tmp_path, name, "stats", "table.*.hand_ended")
    queue = one(objs, "Queue", f"gin.sub.{name}.queue")["spec"]
    assert queue["type"] == "quorum"
    assert queue["durable"]
    assert not queue["autoDelete"]
    dead = f"gin.sub.{name}.dead"
    assert queue["arguments"] == {"x-dead-letter-exchange": dead}
    assert one(objs, "Exchange", dead)["spec"]["type"] == "fanout"
    assert one(objs, "Queue", dead)["spec"]["type"] == "quorum"
    bindings = {
        (b["spec"]["source"], b["spec"]["destination"], b["spec"]["routingKey"])
        for b in of_kind(objs, "Binding")
    }
    assert bindings == {
        (EVENTS_EXCHANGE, f"gin.sub.{name}.queue", "table.*.hand_ended"),
        (dead, dead, ""),
    }
    user = of_kind(objs, "User")[0]
    assert user["metadata"]["name"] == f"gin-sub-{name}"
    assert user["spec"]["importCredentialsSecret"] == {"name": f"gin-sub-{name}-amqp"}
    assert not user["spec"].get("tags"), "no management access"


def test_the_user_may_use_only_its_own_queues(tmp_path: Path) -> None:
    objs = team(tmp_path, "notifier", "notifier", "#")
    (permission,) = of_kind(objs, "Permission")
    assert permission["spec"]["userReference"] == {"name": "gin-sub-notifier"}
    granted: dict[str, Any] = permission["spec"]["permissions"]
    own = ["gin.sub.notifier.queue", "gin.sub.notifier.dead"]
    for resource in own:
        for what in ("configure", "write", "read"):
            assert _can(granted[what], resource), (what, resource)
    assert _can(granted["read"], EVENTS_EXCHANGE)  # to bind on it
    others = [
        EVENTS_EXCHANGE,
        HISTORY_STREAM,
        COMMANDS_QUEUE,
        bot_queue("tito"),
        "gin.bots",
        "gin.sockets",
        "gin.dead",
        "gin.chat",
        "gin.timers",
        "amq.default",
        "gin.sub.other.queue",
        "gin.sub.notifier.queue2",
        "gin.sub.notifierx.queue",
        "amq.gen-abc",
    ]
    for resource in others:
        assert not _can(granted["configure"], resource), resource
        assert not _can(granted["write"], resource), resource
        if resource != EVENTS_EXCHANGE:
            assert not _can(granted["read"], resource), resource


def test_only_the_subscribers_pods_reach_rabbitmq_and_only_on_amqp(tmp_path: Path) -> None:
    objs = team(tmp_path, "notifier", "notifications", "#")
    prod = rendered("prod")
    policies = of_kind(prod, "NetworkPolicy") + of_kind(objs, "NetworkPolicy")
    (rabbitmq,) = [
        p for p in _pods(prod, "gin") if p.labels.get("gin.selminha.com/server") == "rabbitmq"
    ]
    label = {"gin.selminha.com/subscriber": "notifier"}
    theirs = Pod("notifier-7c9", "notifications", label)
    assert reachable(policies, theirs, rabbitmq, 5672)
    for port in (15672, 15692, 25672):
        assert not reachable(policies, theirs, rabbitmq, port), port
    strangers = [
        Pod("other", "notifications", {}),  # their namespace, not labelled
        Pod("elsewhere", "stats", label),  # labelled, another namespace
        Pod("other-team", "notifications", {"gin.selminha.com/subscriber": "stats"}),
    ]
    without = of_kind(prod, "NetworkPolicy")
    for pod in strangers:
        assert not reachable(policies, pod, rabbitmq, 5672), pod.name
    assert not reachable(without, theirs, rabbitmq, 5672), "the component's policy lets it in"


def test_two_teams_do_not_collide(tmp_path: Path) -> None:
    a = team(tmp_path, "notifier", "notifier", "#")
    b = team(tmp_path, "stats", "stats", "table.*.hand_ended")
    names_a = {(o["kind"], o["metadata"]["name"]) for o in a}
    names_b = {(o["kind"], o["metadata"]["name"]) for o in b}
    assert not names_a & names_b
    prod_names = {(o["kind"], o["metadata"]["name"]) for o in rendered("prod")}
    assert not names_a & prod_names


def test_the_history_component_adds_reading_the_stream_and_nothing_else(tmp_path: Path) -> None:
    plain = team(tmp_path, "stats", "stats", "#")
    (before,) = of_kind(plain, "Permission")
    (after,) = of_kind(team(tmp_path, "stats-h", "stats", "#", history=True), "Permission")
    assert not _can(before["spec"]["permissions"]["read"], HISTORY_STREAM)
    read = after["spec"]["permissions"]["read"]
    assert _can(read, HISTORY_STREAM)
    for resource in ("gin.sub.stats-h.queue", "gin.sub.stats-h.dead", EVENTS_EXCHANGE):
        assert _can(read, resource), resource
    for resource in (COMMANDS_QUEUE, "gin.sub.stats.queue", "gin.chat", "gin.events.historyx"):
        assert not _can(read, resource), resource
    for what in ("configure", "write"):
        assert not _can(after["spec"]["permissions"][what], HISTORY_STREAM)
