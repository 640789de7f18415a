"""What the dashboards and alerts may read: the metric names each source serves, and the names
a PromQL expression reads.

The services' names come from their code (every ``gin_*`` collector, as prometheus_client
exposes it) and from their built apps' registries (the process and garbage-collector
collectors). The servers' names are listed here with where each comes from: CloudNativePG 1.30's
default monitoring queries (``cnpg_<query>_<column>``), the Barman Cloud plugin, the kubelet,
kube-state-metrics, and the rabbitmq_prometheus plugin (checked against a real node's
``/metrics`` by test_broker_metrics.py).
"""

from __future__ import annotations

import functools
import importlib
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_manifests import _exported_metrics

PROMTOOL = shutil.which("promtool")

# CloudNativePG's default monitoring queries (config/manager/default-monitoring.yaml): the
# exporter names a column's series cnpg_<query>_<column>.
CNPG_QUERIES = {
    "backends": ("total", "max_tx_duration_seconds"),
    "backends_waiting": ("total",),
    "pg_replication": ("lag", "in_recovery", "is_wal_receiver_up", "streaming_replicas"),
    "pg_stat_archiver": (
        "archived_count",
        "failed_count",
        "seconds_since_last_archival",
        "seconds_since_last_failure",
        "last_archived_time",
        "last_failed_time",
    ),
    "pg_stat_database": ("xact_commit", "xact_rollback", "deadlocks", "blks_read", "blks_hit"),
}
CNPG = {f"cnpg_{query}_{column}" for query, columns in CNPG_QUERIES.items() for column in columns}
# The Barman Cloud plugin's metrics, through the instance's exporter (its "Observability" page:
# they replace cnpg_collector_last_{available,failed}_backup_timestamp).
BARMAN_CLOUD = {
    "barman_cloud_cloudnative_pg_io_last_available_backup_timestamp",
    "barman_cloud_cloudnative_pg_io_last_failed_backup_timestamp",
    "barman_cloud_cloudnative_pg_io_first_recoverability_point",
}
# The kubelet's volume statistics and kube-state-metrics' objects (kube-prometheus-stack
# scrapes both), and Prometheus' own up.
KUBERNETES = {
    "kubelet_volume_stats_available_bytes",
    "kubelet_volume_stats_capacity_bytes",
    "kube_statefulset_replicas",
    "kube_statefulset_status_replicas_ready",
    "kube_deployment_status_replicas_unavailable",
    "up",
}
# The rabbitmq_prometheus plugin, with per-object metrics on (queue= labels).
RABBITMQ = {
    "rabbitmq_identity_info",
    "rabbitmq_alarms_memory_used_watermark",
    "rabbitmq_alarms_free_disk_space_watermark",
    "rabbitmq_process_resident_memory_bytes",
    "rabbitmq_resident_memory_limit_bytes",
    "rabbitmq_connections",
    "rabbitmq_global_messages_received_total",
    "rabbitmq_global_messages_delivered_total",
    "rabbitmq_queue_messages_ready",
    "rabbitmq_queue_messages",
    "rabbitmq_queue_consumers",
    "rabbitmq_raft_term_total",
}
SERVERS = CNPG | BARMAN_CLOUD | KUBERNETES | RABBITMQ

SERVICES = ("table", "chat", "timers", "bots")


@functools.cache
def built_apps_serve() -> frozenset[str]:
    """The series names each service's app serves as built (its process collectors)."""
    from shared.infra.ops import REGISTRY
    from shared.infra.settings import Settings

    names: set[str] = set()
    for service in SERVICES:
        app = importlib.import_module(f"services.{service}.app").create_app(
            Settings(dev_tokens=service == "table")
        )
        text = generate_latest(app[REGISTRY]).decode()
        for family in text_string_to_metric_families(text):
            names.update(sample.name for sample in family.samples)
    return frozenset(names)


def served() -> set[str]:
    """Every series name a dashboard or an alert may read."""
    return set(_exported_metrics()) | set(built_apps_serve()) | SERVERS


# --- the names an expression reads -------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.])([a-zA-Z_:][\w:]*)(?!\w)(?!\s*\()")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}
# What Grafana puts in place of its variables before Prometheus sees an expression.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": "gin", "$service": ".+"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels or keywords).

    >>> sorted(metric_names('sum by (le) (rate(a_bucket{q=~"x|y"}[5m])) / on (p) group_left b'))
    ['a_bucket', 'b']
    """
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    return {m for m in _NAME.findall(text) if m.lower() not in _KEYWORDS}


def with_grafana_values(expr: str) -> str:
    """A dashboard's expression as Grafana sends it (its variables given values)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run promtool (the caller skips when it is not installed)."""
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def write_rules(path: Path, groups: Iterable[dict[str, object]]) -> Path:
    """A Prometheus rule file of these groups."""
    path.write_text(yaml.safe_dump({"groups": list(groups)}, sort_keys=False))
    return path
