"""The alerts of the servers around the services (issue 34, part 3) and every alert's PromQL.

Every alert of the prod overlay's PrometheusRules parses (``promtool check rules``) and reads
only metrics something serves (tests/deploy/served.py). The alerts of gin-server-alerts
(PostgreSQL, RabbitMQ, the subscribers' queues) each fire on made-up series and stay quiet on
others (server_alerts_cases.yaml, run by ``promtool test rules``); the same run with a
threshold changed fails, so the cases can fail. promtool is Debian's (``apt-get install
prometheus``); without it those tests skip and say so.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import served
from tests.deploy.test_manifests import ROOT, _alerts, named, of_kind, rendered

CASES = Path(__file__).with_name("server_alerts_cases.yaml")
Obj = dict[str, Any]


def _needs_promtool() -> None:
    if served.PROMTOOL is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")


def _groups(rule: Obj, *, annotations: bool = True) -> list[Obj]:
    """A PrometheusRule's groups as a Prometheus rule file has them."""
    groups: list[Obj] = copy.deepcopy(rule["spec"]["groups"])
    if not annotations:  # the unit tests compare labels; the runbook test checks annotations
        for group in groups:
            for alert in group["rules"]:
                alert.pop("annotations", None)
    return groups


def _run_cases(tmp_path: Path, rule: Obj) -> tuple[int, str]:
    served.write_rules(tmp_path / "rules.yaml", _groups(rule, annotations=False))
    cases = yaml.safe_load(CASES.read_text())
    cases["rule_files"] = ["rules.yaml"]
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(cases, sort_keys=False))
    done = served.promtool("test", "rules", "cases.yaml", cwd=tmp_path)
    return done.returncode, done.stdout + done.stderr


def test_every_alert_parses(tmp_path: Path) -> None:
    _needs_promtool()
    rules = of_kind(rendered("prod"), "PrometheusRule")
    assert {r["metadata"]["name"] for r in rules} == {"gin-alerts", "gin-server-alerts"}
    paths = [
        str(served.write_rules(tmp_path / f"{r['metadata']['name']}.yaml", _groups(r)))
        for r in rules
    ]
    done = served.promtool("check", "rules", *paths, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_reads_only_served_metrics() -> None:
    known = served.served()
    alerts = list(_alerts(rendered("prod")))
    assert len(alerts) >= 25
    for alert in alerts:
        read = served.metric_names(alert["expr"])
        assert read, alert["alert"]
        assert read <= known, f"{alert['alert']} reads what nothing serves: {read - known}"


def test_the_servers_are_watched_as_the_issue_asks() -> None:
    """PostgreSQL (replication lag, a failed backup or none in a day, the WAL volume filling),
    RabbitMQ (a node down, a memory alarm, a quorum queue without a leader), and the
    subscribers' queues (gin.sub.*: depth and age)."""
    rule = named(rendered("prod"), "PrometheusRule", "gin-server-alerts")
    exprs = {a["alert"]: a["expr"] for g in rule["spec"]["groups"] for a in g["rules"]}
    wanted = {
        "GinPostgresReplicationLagging": "cnpg_pg_replication_lag",
        "GinPostgresBackupFailed": "barman_cloud_cloudnative_pg_io_last_failed_backup_timestamp",
        "GinPostgresBackupMissing": "last_available_backup_timestamp",
        "GinPostgresWalVolumeFilling": "gin-postgres-[0-9]+-wal",
        "GinRabbitmqNodeDown": "gin-rabbitmq-server",
        "GinRabbitmqMemoryAlarm": "rabbitmq_alarms_memory_used_watermark",
        "GinQuorumQueueWithoutLeader": "rabbitmq_raft_term_total",
        "GinSubscriberQueueBacklog": r"gin\\.sub\\.",
        "GinSubscriberQueueStale": "min_over_time",
    }
    for alert, needle in wanted.items():
        assert needle in exprs[alert], alert


def test_each_server_alert_fires_on_its_cases(tmp_path: Path) -> None:
    _needs_promtool()
    rule = named(rendered("prod"), "PrometheusRule", "gin-server-alerts")
    cases = yaml.safe_load(CASES.read_text())
    fired = {
        check["alertname"]
        for test in cases["tests"]
        for check in test["alert_rule_test"]
        if check["exp_alerts"]
    }
    alerts = {a["alert"] for g in rule["spec"]["groups"] for a in g["rules"]}
    assert fired == alerts, f"alerts with no case where they fire: {alerts - fired}"
    code, output = _run_cases(tmp_path, rule)
    assert code == 0, output
    assert "SUCCESS" in output


def test_the_cases_fail_when_an_alert_is_wrong(tmp_path: Path) -> None:
    _needs_promtool()
    rule = copy.deepcopy(named(rendered("prod"), "PrometheusRule", "gin-server-alerts"))
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            if alert["alert"] == "GinSubscriberQueueBacklog":
                alert["expr"] = alert["expr"].replace("> 10000", "> 30000")
    code, output = _run_cases(tmp_path, rule)
    assert code != 0
    assert "GinSubscriberQueueBacklog" in output


def test_the_subscribers_guide_names_their_alerts() -> None:
    """docs/subscribing.md tells the teams which alerts watch their queues: those that exist,
    every one of them."""
    guide = (ROOT / "docs" / "subscribing.md").read_text()
    alerts = {a["alert"] for a in _alerts(rendered("prod"))}
    named_there = set(re.findall(r"\bGin[A-Z]\w+", guide))
    assert named_there <= alerts, named_there - alerts
    assert {a for a in alerts if a.startswith("GinSubscriber")} <= named_there
