"""The Grafana dashboards (issue 34, part 2): shipped by the monitoring component, valid
dashboards, and charting only what is served.

Each dashboard under deploy/k8s/components/monitoring/dashboards is a ConfigMap of the prod
overlay labelled for Grafana's dashboard sidecar; it has a uid, a title, a Prometheus datasource
variable every panel uses, and panels with queries; every metric its PromQL reads is one a
service serves (its code's collectors, its app's process collectors) or a server's exporter
serves (tests/deploy/served.py); every expression parses (promtool, where installed); and every
alert a panel names exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import served
from tests.deploy.test_manifests import K8S, _alerts, of_kind, rendered

DASHBOARDS = K8S / "components" / "monitoring" / "dashboards"
Obj = dict[str, Any]


def dashboards() -> dict[str, Obj]:
    """Each dashboard file's JSON, by file name."""
    found = {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}
    assert len(found) >= 2
    return found


def panels(board: Obj) -> list[Obj]:
    """A dashboard's panels, those inside collapsed rows too (rows themselves left out)."""
    found: list[Obj] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def expressions(board: Obj) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of a dashboard, its variables' queries included."""
    found = [(p["title"], t["expr"]) for p in panels(board) for t in p["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            found.append((f"variable {variable['name']}", inner.group(1) if inner else query))
    return found


def test_the_monitoring_component_ships_every_dashboard_to_grafana() -> None:
    objs = rendered("prod")
    maps = [
        m
        for m in of_kind(objs, "ConfigMap")
        if "grafana_dashboard" in m["metadata"].get("labels", {})
    ]
    shipped = {key: json.loads(value) for m in maps for key, value in m["data"].items()}
    assert shipped == dashboards()
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        # No hash suffix: a changed dashboard replaces its ConfigMap, never sits beside it.
        assert config_map["metadata"]["name"].startswith("gin-dashboard-")
        assert not re.search(r"-[a-z0-9]{10}$", config_map["metadata"]["name"])
        assert len(json.dumps(config_map)) < 262_144, "kubectl apply's annotation limit"
    assert not any("grafana_dashboard" in str(o) for o in rendered("dev")), "prod only"


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_each_dashboard_is_a_grafana_dashboard(name: str) -> None:
    board = dashboards()[name]
    assert re.fullmatch(r"[a-z0-9-]{1,40}", board["uid"])
    assert board["title"].startswith("Selminha Gin")
    assert isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    uses_datasource = {"type": "prometheus", "uid": "${datasource}"}
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == uses_datasource, variable["name"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    charts = panels(board)
    assert len(charts) >= 8
    for panel in charts:
        where = f"{name}: {panel['title']}"
        assert panel["datasource"] == uses_datasource, where
        assert panel["targets"], where
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        for target in panel["targets"]:
            assert target["expr"].strip(), where
            assert target.get("datasource", uses_datasource) == uses_datasource, where
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, where
        assert grid["h"] > 0, where
        assert panel.get("description"), f"{where}: say what the chart shows"
    uids = [b["uid"] for b in dashboards().values()]
    assert len(uids) == len(set(uids))


def test_the_services_dashboard_charts_what_the_issue_asks() -> None:
    """Each service's rate, errors and duration; the outbox lag; the bot queues; sockets;
    pauses; the database pool (its waits and the connections in use)."""
    board = dashboards()["gin-services.json"]
    read = set().union(*(served.metric_names(e) for _, e in expressions(board)))
    for metric in (
        "gin_http_responses_total",
        "gin_http_request_seconds_bucket",
        "gin_outbox_lag_seconds",
        "rabbitmq_queue_messages_ready",
        "gin_bot_decisions_total",
        "gin_websockets",
        "gin_gc_pause_seconds_bucket",
        "gin_event_loop_lag_seconds_bucket",
        "gin_db_pool_wait_seconds_bucket",
        "cnpg_backends_total",
    ):
        assert metric in read, metric
    texts = " ".join(e for _, e in expressions(board))
    assert 'status=~"5.."' in texts
    assert "by (gin_service" in texts


def test_the_metric_name_reader_finds_names_and_only_names() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (gin_service, le) (rate(a_seconds_bucket{route!="x",'
        ' q=~"b|c"}[5m] offset 1h))) > 0.25 and on (namespace) group_left (d) count(e) * 2'
        " or absent(f) unless time() - g_total > 1e3"
    )
    assert served.metric_names(expr) == {"a_seconds_bucket", "e", "f", "g_total"}
    assert served.metric_names("max(x:recorded)") == {"x:recorded"}


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_every_metric_a_dashboard_charts_is_served(name: str) -> None:
    known = served.served()
    assert "process_resident_memory_bytes" in known  # from the built apps themselves
    missing = {
        f"{title}: {metric}"
        for title, expr in expressions(dashboards()[name])
        for metric in served.metric_names(expr)
        if metric not in known
    }
    assert not missing, f"charted but served by nothing: {sorted(missing)}"


def test_every_alert_a_dashboard_names_exists() -> None:
    alerts = {a["alert"] for a in _alerts(rendered("prod"))}
    named = set()
    for board in dashboards().values():
        named |= set(re.findall(r"\bGin[A-Z]\w+", json.dumps(board)))
    assert named
    assert named <= alerts, named - alerts


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    if served.PROMTOOL is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    rules = []
    for name, board in dashboards().items():
        for n, (_, expr) in enumerate(expressions(board)):
            record = f"dashboard:{name.removesuffix('.json').replace('-', '_')}_{n}"
            rules.append({"record": record, "expr": served.with_grafana_values(expr)})
    group = {"name": "dashboards", "rules": rules}
    path = served.write_rules(tmp_path / "dashboards.yaml", [group])
    done = served.promtool("check", "rules", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = served.write_rules(
        tmp_path / "broken.yaml",
        [{"name": "b", "rules": [{"record": "b:x", "expr": "sum by (le (rate(x[5m]))"}]}],
    )
    assert served.promtool("check", "rules", str(broken), cwd=tmp_path).returncode != 0
