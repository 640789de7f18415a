"""The RabbitMQ metrics the alerts and dashboards read, on real nodes (issue 34, part 3).

A throwaway cluster of three nodes (chaos/rabbits.py, Debian's RabbitMQ) with the
rabbitmq_prometheus plugin on and per-object metrics, as production's RabbitmqCluster has
them, holding a subscriber's quorum queues. Every rabbitmq_* name tests/deploy/served.py lists
is served. Then GinQuorumQueueWithoutLeader is evaluated (promtool) on what the nodes serve:
quiet with the three members up, firing for the queue once two of its nodes are stopped.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from chaos.rabbits import RabbitCluster
from scripts import servers
from tests.deploy import served
from tests.deploy.test_manifests import ROOT, named, rendered

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
QUEUE = "gin.sub.probe.queue"
DEAD = "gin.sub.probe.dead"
Samples = list[tuple[str, dict[str, str], float]]


class PrometheusCluster(RabbitCluster):
    """Three nodes as RabbitCluster makes them, each with the Prometheus plugin on a port of
    its own and per-object metrics (queue= labels), as production sets them."""

    def _prepare(self, entry: servers.RabbitState) -> None:
        super()._prepare(entry)
        root = Path(entry.root)
        (port,) = servers.free_ports(1)
        self.metrics_ports = getattr(self, "metrics_ports", {})
        self.metrics_ports[entry.nodename] = port
        with (root / "rabbitmq.conf").open("a") as conf:
            conf.write(
                f"prometheus.tcp.ip = {servers.LOCALHOST}\n"
                f"prometheus.tcp.port = {port}\n"
                "prometheus.return_per_object_metrics = true\n"
            )
        (root / "enabled_plugins").write_text("[rabbitmq_prometheus].\n")

    def scrape(self, name: str) -> Samples:
        """One node's /metrics: (name, labels, value) of every sample."""
        url = f"http://{servers.LOCALHOST}:{self.metrics_ports[name]}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
        return [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]


async def _declare_subscriber_queues(url: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in (QUEUE, DEAD):
            await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        for _ in range(3):
            await channel.default_exchange.publish(
                aio_pika.Message(b"{}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=QUEUE,
            )


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrometheusCluster]:
    cluster = PrometheusCluster(ROOT / ".run" / f"broker-metrics-{uuid.uuid4().hex[:8]}")
    try:
        asyncio.run(_declare_subscriber_queues(cluster.urls[0]))
        yield cluster
    finally:
        cluster.stop()


def _scrape_until(cluster: PrometheusCluster, name: str, wanted: str, queue: str) -> Samples:
    """A node's samples once it reports ``wanted`` for the queue (per-object metrics are
    collected every few seconds)."""
    deadline = time.monotonic() + 60
    while True:
        samples = cluster.scrape(name)
        if any(n == wanted and labels.get("queue") == queue for n, labels, _ in samples):
            return samples
        assert time.monotonic() < deadline, f"{name} never reported {wanted} for {queue}"
        time.sleep(1)


def test_every_rabbitmq_metric_read_is_served(cluster: PrometheusCluster) -> None:
    found: set[str] = set()
    for name in cluster.names():
        found |= {n for n, _, _ in _scrape_until(cluster, name, "rabbitmq_raft_term_total", QUEUE)}
    leader = cluster.leader_of(QUEUE)
    found |= {n for n, _, _ in _scrape_until(cluster, leader, "rabbitmq_queue_messages", QUEUE)}
    missing = served.RABBITMQ - found
    assert not missing, f"read by the alerts or dashboards, served by no node: {missing}"


def _quorum_alert_cases(samples_by_node: dict[str, Samples]) -> dict[str, object]:
    """promtool cases: the raft series the nodes served (each labelled with its node as a pod)
    and the StatefulSet's 3 replicas, evaluated for GinQuorumQueueWithoutLeader."""
    series = [
        {
            "series": "kube_statefulset_replicas"
            '{namespace="gin", statefulset="gin-rabbitmq-server"}',
            "values": "3x10",
        }
    ]
    for node, samples in samples_by_node.items():
        for metric, labels, value in samples:
            if metric == "rabbitmq_raft_term_total" and labels.get("queue") in (QUEUE, DEAD):
                selector = ", ".join(
                    ['namespace="gin"', f'pod="{node}"']
                    + [f'{k}="{v}"' for k, v in sorted(labels.items())]
                )
                series.append({"series": f"{metric}{{{selector}}}", "values": f"{value:g}x10"})
    return {"interval": "1m", "input_series": series}


def _evaluate(tmp_path: Path, cases: dict[str, object], expected: list[str]) -> None:
    rule = named(rendered("prod"), "PrometheusRule", "gin-server-alerts")
    group = next(g for g in rule["spec"]["groups"] if g["name"] == "gin.rabbitmq")
    alert = next(a for a in group["rules"] if a["alert"] == "GinQuorumQueueWithoutLeader")
    bare = {k: v for k, v in alert.items() if k != "annotations"}
    served.write_rules(tmp_path / "rules.yaml", [{"name": "q", "rules": [bare]}])
    exp = [
        {"exp_labels": {"severity": "critical", "namespace": "gin", "vhost": "/", "queue": q}}
        for q in expected
    ]
    test = {
        **cases,
        "alert_rule_test": [
            {"eval_time": "8m", "alertname": "GinQuorumQueueWithoutLeader", "exp_alerts": exp}
        ],
    }
    (tmp_path / "cases.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [test]}, sort_keys=False)
    )
    done = served.promtool("test", "rules", "cases.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_quorum_queue_without_a_majority_fires_its_alert(
    cluster: PrometheusCluster, tmp_path: Path
) -> None:
    if served.PROMTOOL is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    up = {n: _scrape_until(cluster, n, "rabbitmq_raft_term_total", QUEUE) for n in cluster.names()}
    members = [
        n
        for n, s in up.items()
        for m, lb, _ in s
        if m == "rabbitmq_raft_term_total" and lb.get("queue") == QUEUE
    ]
    assert len(members) == 3
    (tmp_path / "all").mkdir()
    _evaluate(tmp_path / "all", _quorum_alert_cases(up), expected=[])

    leader = cluster.leader_of(QUEUE)
    stopped = [leader, next(n for n in cluster.names() if n != leader)]
    for name in stopped:
        cluster.stop_node(name)
    (survivor,) = [n for n in cluster.names() if n not in stopped]
    left = {survivor: _scrape_until(cluster, survivor, "rabbitmq_raft_term_total", QUEUE)}
    (tmp_path / "one").mkdir()
    _evaluate(tmp_path / "one", _quorum_alert_cases(left), expected=[DEAD, QUEUE])
