"""PostgreSQL in the manifests (issue 14, part 6): a role per service, backups, and the
runbook's restore to a point in time, checked on the rendered overlays.

Each workload with a database connects with its own Secret (in prod, the password of a role
CloudNativePG manages, which the Cluster's bootstrap makes the owner of the service's schema;
tests/deploy/test_database_roles.py runs that SQL on a real server). The prod Cluster archives
to an object store with a retention, a ScheduledBackup takes base backups, and the Cluster the
runbook restores from reads the same bucket, looks like production's to the NetworkPolicies,
and is admitted by them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
import yaml

from services.chat.app import SCHEMA as CHAT_SCHEMA
from services.table.app import SCHEMA as TABLE_SCHEMA
from services.timers.app import SCHEMA as TIMERS_SCHEMA
from shared.infra.settings import env_name
from tests.deploy.test_manifests import (
    KUBECTL,
    NAMESPACES,
    RUNBOOK,
    Pod,
    _pods,
    component,
    containers,
    named,
    of_kind,
    reachable,
    rendered,
)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays")
SCHEMAS = {"table": TABLE_SCHEMA, "chat": CHAT_SCHEMA, "timers": TIMERS_SCHEMA}
Obj = dict[str, Any]


def database_secret(container: Obj) -> str | None:
    """The Secret a container's GIN_DATABASE_URL comes from, if it has one."""
    for var in container.get("env", []):
        if var["name"] == env_name("database_url"):
            name: str = var["valueFrom"]["secretKeyRef"]["name"]
            return name
    return None


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_each_service_connects_with_its_own_database_secret(overlay: str) -> None:
    objs = rendered(overlay)
    seen: dict[str, set[str]] = {}
    for workload in [o for o in objs if o["kind"] in ("Deployment", "Job")]:
        for container in containers(workload):
            secret = database_secret(container)
            if secret is None:
                continue
            # A service's Deployment, or its container in the migrations Job; the table's
            # outbox relay (table.relay) is the table's code, with the table's role.
            service = (
                container["name"]
                if workload["kind"] == "Job"
                else component(workload).partition(".")[0]
            )
            # dev's generated Secrets carry a hash of their content after the name.
            assert re.fullmatch(rf"gin-{service}-database(-[a-z0-9]{{10}})?", secret), secret
            seen.setdefault(service, set()).add(workload["kind"])
    assert seen == {s: {"Deployment", "Job"} for s in SCHEMAS}


def test_prod_gives_each_service_a_role_owning_its_schema() -> None:
    cluster = named(rendered("prod"), "Cluster", "gin-postgres")["spec"]
    roles = {r["name"]: r for r in cluster["managed"]["roles"]}
    assert set(roles) == {f"gin_{s}" for s in SCHEMAS}
    statements = [
        " ".join(s.split()) for s in cluster["bootstrap"]["initdb"]["postInitApplicationSQL"]
    ]
    for service, schema in SCHEMAS.items():
        role = roles[f"gin_{service}"]
        assert role["ensure"] == "present"
        assert role["login"] is True
        assert role["passwordSecret"]["name"] == f"gin-{service}-database"
        for grant in ("superuser", "createdb", "createrole", "replication", "bypassrls"):
            assert not role.get(grant), (role["name"], grant)
        assert not role.get("inRoles"), "a member of no other role"
        assert f"CREATE ROLE {role['name']} LOGIN" in statements
        assert f"CREATE SCHEMA {schema} AUTHORIZATION {role['name']}" in statements
    # Nothing else: no GRANT widening a role past its schema.
    assert len(statements) == 2 * len(SCHEMAS)
    owner = cluster["bootstrap"]["initdb"]["owner"]
    assert owner not in roles, "the database owner is no service's role"


BARMAN_PLUGIN = "barman-cloud.cloudnative-pg.io"


def object_store(objs: tuple[Obj, ...], name: str) -> Obj:
    """The Barman Cloud plugin's ObjectStore of that name."""
    return named(objs, "ObjectStore", name)


def test_prod_backs_up_postgres_to_an_object_store() -> None:
    objs = rendered("prod")
    cluster = named(objs, "Cluster", "gin-postgres")
    assert "backup" not in cluster["spec"], "the in-tree barmanObjectStore is deprecated"
    (archiver,) = [p for p in cluster["spec"]["plugins"] if p.get("isWALArchiver")]
    assert archiver["name"] == BARMAN_PLUGIN
    assert "serverName" not in archiver["parameters"], "the Cluster's own name"
    store = object_store(objs, archiver["parameters"]["barmanObjectName"])["spec"]
    assert re.fullmatch(r"[1-9][0-9]*[dwm]", store["retentionPolicy"])
    configuration = store["configuration"]
    assert configuration["destinationPath"].startswith("s3://")
    assert set(configuration["s3Credentials"]) == {"accessKeyId", "secretAccessKey"}
    assert {ref["name"] for ref in configuration["s3Credentials"].values()} == {"gin-backup-s3"}
    assert configuration["wal"]["compression"]
    assert configuration["data"]["compression"]
    (scheduled,) = of_kind(objs, "ScheduledBackup")
    spec = scheduled["spec"]
    assert spec["cluster"] == {"name": cluster["metadata"]["name"]}
    assert spec["method"] == "plugin"
    assert spec["pluginConfiguration"]["name"] == BARMAN_PLUGIN
    assert spec["backupOwnerReference"] == "self"
    fields = spec["schedule"].split()
    assert len(fields) == 6, "CloudNativePG's schedule has seconds first"
    assert fields[3:] == ["*", "*", "*"], "at least daily"
    assert spec["immediate"] is True, "a base backup as soon as the Cluster exists"


def test_prod_replicates_synchronously() -> None:
    """A commit waits for one standby's WAL, and waits rather than go on without one: a
    failover then loses no acknowledged move (issue 27)."""
    cluster = named(rendered("prod"), "Cluster", "gin-postgres")["spec"]
    synchronous = cluster["postgresql"]["synchronous"]
    assert synchronous["dataDurability"] == "required"
    assert synchronous["method"] in ("any", "first")
    assert synchronous["number"] >= 1
    assert cluster["instances"] >= synchronous["number"] + 2, "one standby may be lost"
    parameters = cluster["postgresql"].get("parameters", {})
    assert parameters.get("synchronous_commit", "on") in ("on", "remote_write", "remote_apply")


def test_postgres_images_are_pinned() -> None:
    """A minor release (or a digest), never a floating major tag."""
    pinned = re.compile(r"[^:@]+(:[0-9]+\.[0-9]+(-[a-z0-9]+)*|@sha256:[0-9a-f]{64})")
    cluster = named(rendered("prod"), "Cluster", "gin-postgres")["spec"]
    assert pinned.fullmatch(cluster["imageName"]), cluster["imageName"]
    assert restore_cluster()["spec"]["imageName"] == cluster["imageName"]
    dev = named(rendered("dev"), "StatefulSet", "gin-postgres")
    (server,) = dev["spec"]["template"]["spec"]["containers"]
    assert pinned.fullmatch(server["image"]), server["image"]
    assert not pinned.fullmatch("postgres:15-bookworm")


def restore_cluster() -> Obj:
    """The Cluster of the runbook's "Restore to a point in time"."""
    text = RUNBOOK.read_text()
    section = text.split("### Restore to a point in time", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    obj: Obj = yaml.safe_load("\n".join(line[indent:] for line in lines))
    return obj


def test_the_runbook_restores_from_the_backups_to_a_point_in_time() -> None:
    objs = rendered("prod")
    production = named(objs, "Cluster", "gin-postgres")
    restored = restore_cluster()
    assert restored["kind"] == "Cluster"
    assert restored["apiVersion"] == production["apiVersion"]
    assert restored["metadata"]["name"] != production["metadata"]["name"], "beside, not over"
    assert restored["metadata"]["namespace"] == NAMESPACES["prod"]
    spec = restored["spec"]
    for same in ("imageName", "inheritedMetadata", "instances", "storage", "walStorage"):
        assert spec[same] == production["spec"][same], same
    recovery = spec["bootstrap"]["recovery"]
    target = recovery["recoveryTarget"]["targetTime"]
    assert datetime.fromisoformat(target).utcoffset() is not None, "a time with its zone"
    (source,) = [c for c in spec["externalClusters"] if c["name"] == recovery["source"]]
    (archiver,) = [p for p in production["spec"]["plugins"] if p.get("isWALArchiver")]
    assert source["plugin"]["name"] == archiver["name"] == BARMAN_PLUGIN
    read = source["plugin"]["parameters"]
    assert read["barmanObjectName"] == archiver["parameters"]["barmanObjectName"]
    assert read["serverName"] == production["metadata"]["name"]
    object_store(objs, read["barmanObjectName"])
    # It archives beside production's WAL, never over it, and as durably.
    (own,) = [p for p in spec["plugins"] if p.get("isWALArchiver")]
    assert own["parameters"]["serverName"] == restored["metadata"]["name"]
    assert spec["postgresql"]["synchronous"] == production["spec"]["postgresql"]["synchronous"]
    # Its pods reach each other (replication) and the services reach it, as production's.
    policies = of_kind(objs, "NetworkPolicy")
    pods = {p.name: p for p in _pods((*objs, restored), NAMESPACES["prod"])}
    new = pods[restored["metadata"]["name"]]
    assert reachable(policies, new, new, 5432)
    for service in SCHEMAS:
        assert reachable(policies, pods[f"gin-{service}"], new, 5432), service
    stranger = Pod("stranger", NAMESPACES["prod"], {})
    assert not reachable(policies, stranger, new, 5432)
