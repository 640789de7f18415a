"""The operators' objects of both overlays, checked against the operators' own schemas (issue 27).

kubernetes-validate knows only Kubernetes' built-in kinds. A Cluster, RabbitmqCluster, Queue,
ScaledObject or PodMonitor is checked by the API server against its CustomResourceDefinition's
``openAPIV3Schema``; these tests do the same with the CRDs the operators publish, kept in
``../shared/crds`` (their versions in its README), and refuse every field a schema does not
declare, as ``kubectl apply --validate=strict`` (server-side field validation ``Strict``) does
instead of pruning it. Kubernetes' structural-schema extensions are honoured:
``x-kubernetes-preserve-unknown-fields`` (the only places unknown fields are kept),
``x-kubernetes-int-or-string``, ``x-kubernetes-embedded-resource`` and ``nullable``; and the
CRDs' CEL rules (``x-kubernetes-validations``) are evaluated with cel-python, as on a create.

The CRDs stay in ``../shared/crds`` (public data is never copied into the repository): where
that folder is absent, the tests skip and say so.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from tests.deploy.test_manifests import CUSTOM_GROUPS, OVERLAYS, ROOT, rendered

CRDS = ROOT.parent / "shared" / "crds"
Obj = dict[str, Any]
# The Barman Cloud plugin's ObjectStore has no CRD in ../shared/crds; its documentation gives
# spec.configuration the schema of CloudNativePG's in-tree barmanObjectStore and
# spec.retentionPolicy that of the Cluster's backup.retentionPolicy, so it is checked against
# those parts of the Cluster's CRD (strictly too).
OBJECT_STORE = ("barmancloud.cnpg.io/v1", "ObjectStore")
_cel = celpy.Environment()


def _crds_or_skip() -> Path:
    if not CRDS.is_dir():
        pytest.skip(f"{CRDS} is absent: the operators' CRDs are read there, never copied here")
    return CRDS


@functools.cache
def _openapi() -> dict[tuple[str, str], Obj]:
    """Every served version's ``openAPIV3Schema`` as the CRD has it, by (apiVersion, kind)."""
    schemas: dict[tuple[str, str], Obj] = {}
    for path in sorted(_crds_or_skip().glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group = crd["spec"]["group"]
            kind = crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served", False):
                    key = (f"{group}/{version['name']}", kind)
                    schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


@functools.cache
def _schemas() -> dict[tuple[str, str], Obj]:
    """Every served version's strict JSON schema, by (apiVersion, kind)."""
    openapis = dict(_openapi())
    backup = openapis[("postgresql.cnpg.io/v1", "Cluster")]["properties"]["spec"]["properties"][
        "backup"
    ]["properties"]
    openapis[OBJECT_STORE] = {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["configuration"],
                "properties": {
                    "configuration": backup["barmanObjectStore"],
                    "retentionPolicy": backup["retentionPolicy"],
                },
            },
        },
    }
    schemas: dict[tuple[str, str], Obj] = {}
    for key, openapi in openapis.items():
        schema = strict(openapi)
        # metadata is the API server's ObjectMeta, checked by it, not by the CRD.
        schema["properties"]["metadata"] = {"type": "object"}
        schemas[key] = schema
    return schemas


def strict(node: Obj) -> Obj:
    """An OpenAPI v3 structural schema as a JSON schema that refuses undeclared fields.

    Where a schema declares ``properties`` (or is an object with neither properties nor a
    map's ``additionalProperties``) and does not say ``x-kubernetes-preserve-unknown-fields``,
    any other field is an error, as the API server's strict field validation reports it.
    """
    out: Obj = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = strict(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [strict(sub) for sub in value]
        elif key == "description" or key.startswith("x-kubernetes-"):
            continue
        else:
            out[key] = value
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if node.get("x-kubernetes-int-or-string") is True:
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **out}
    if node.get("x-kubernetes-embedded-resource") is True:
        props = out.setdefault("properties", {})
        for name in ("apiVersion", "kind"):
            props.setdefault(name, {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and not preserve and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if node.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _errors(obj: Obj) -> list[str]:
    """What the API server would refuse in an object of a custom kind."""
    key = (obj["apiVersion"], obj["kind"])
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    schema = _schemas().get(key)
    if schema is None:
        return [f"{where}: no CRD in {CRDS} serves {key[0]} {key[1]}"]
    validator = jsonschema.Draft4Validator(schema)
    found = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "(the object)"
        found.append(f"{where}: {path}: {error.message}")
    return found


DEPRECATED = re.compile(r"(^|\n)\s*Deprecated\b")
# Deprecated in the operators' release notes though not (yet) in their schemas' descriptions.
# CloudNativePG 1.26 deprecated its in-tree Barman Cloud support for the Barman Cloud plugin,
# and 1.31 removes it.
DEPRECATED_BY_NOTES = {
    ("Cluster", "spec.backup.barmanObjectStore"),
    ("Cluster", "spec.externalClusters[].barmanObjectStore"),
    ("ScheduledBackup", "spec.method=barmanObjectStore"),
}


def nodes(value: Any, schema: Obj, path: str = "") -> Iterator[tuple[Any, Obj, str]]:
    """Every value of an object with the schema that governs it and its path (``a.b[].c``),
    the object itself first."""
    yield value, schema, path
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            inner = props.get(key, extra if isinstance(extra, dict) else {})
            yield from nodes(sub, inner, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for item in value:
            yield from nodes(item, schema.get("items", {}), f"{path}[]")


def deprecated_fields(obj: Obj) -> list[str]:
    """The fields an object sets that its CRD, or its operator's release notes, deprecate."""
    openapi = _openapi().get((obj["apiVersion"], obj["kind"]))
    found: list[str] = []
    spec = {k: v for k, v in obj.items() if k != "metadata"}
    for value, schema, path in nodes(spec, openapi) if openapi is not None else ():
        if DEPRECATED.search(schema.get("description", "")):
            found.append(path)
        if (obj["kind"], path) in DEPRECATED_BY_NOTES:
            found.append(path)
        if isinstance(value, str) and (obj["kind"], f"{path}={value}") in DEPRECATED_BY_NOTES:
            found.append(f"{path}={value}")
    return [f"{obj['kind']}/{obj['metadata']['name']}: {path}" for path in found]


def custom_objects(overlay: str) -> list[Obj]:
    """The overlay's objects of the operators' kinds."""
    return [o for o in rendered(overlay) if o["apiVersion"].split("/")[0] in CUSTOM_GROUPS]


# --- the check itself can fail ------------------------------------------------------------------


def test_the_strict_schemas_refuse_what_the_api_server_refuses() -> None:
    """A misspelt field, a wrong type and a value outside an enum are each refused, and the
    places the CRD keeps unknown fields (a Queue's arguments) accept them."""
    queue: Obj = {
        "apiVersion": "rabbitmq.com/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "q"},
        "spec": {
            "name": "gin.q",
            "type": "quorum",
            "durable": True,
            "arguments": {"x-anything": 1},
            "rabbitmqClusterReference": {"name": "gin-rabbitmq"},
        },
    }
    assert _errors(queue) == []
    misspelt = copy.deepcopy(queue)
    misspelt["spec"]["durabel"] = True
    assert any("durabel" in e for e in _errors(misspelt))
    cluster: Obj = {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "c"},
        "spec": {"instances": "3", "postgresql": {"synchronous": {"method": "all"}}},
    }
    found = "\n".join(_errors(cluster))
    assert "spec.instances" in found
    assert "spec.postgresql.synchronous.method" in found
    nested = copy.deepcopy(cluster)
    nested["spec"] = {"instances": 3, "affinity": {"topologyKey": "x", "topologyKye": "y"}}
    assert any("topologyKye" in e for e in _errors(nested))
    unknown: Obj = {"apiVersion": "rabbitmq.com/v1", "kind": "Queue", "metadata": {"name": "q"}}
    assert _errors(unknown) == [f"Queue/q: no CRD in {CRDS} serves rabbitmq.com/v1 Queue"]


# --- the overlays --------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_objects_pass_their_crds_strictly(overlay: str) -> None:
    objs = custom_objects(overlay)
    errors = [e for obj in objs for e in _errors(obj)]
    assert not errors, "\n".join(errors)
    if overlay == "prod":
        kinds = {o["kind"] for o in objs}
        # Every operator of the production shape is exercised, not silently skipped.
        assert {"Cluster", "ScheduledBackup", "RabbitmqCluster", "Queue", "User"} <= kinds
        assert {"ScaledObject", "PodMonitor", "PrometheusRule", "ObjectStore"} <= kinds


def test_the_deprecation_check_finds_a_deprecated_field() -> None:
    cluster: Obj = {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "c"},
        "spec": {
            "instances": 3,
            "monitoring": {"enablePodMonitor": True},
            "backup": {"barmanObjectStore": {"destinationPath": "s3://b"}},
        },
    }
    assert deprecated_fields(cluster) == [
        "Cluster/c: spec.monitoring.enablePodMonitor",
        "Cluster/c: spec.backup.barmanObjectStore",
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_operator_object_uses_a_deprecated_field(overlay: str) -> None:
    found = [f for obj in custom_objects(overlay) for f in deprecated_fields(obj)]
    assert not found, "\n".join(found)


@functools.cache
def _cel_program(rule: str) -> celpy.Runner:
    return _cel.program(_cel.compile(rule))


def cel_errors(obj: Obj) -> list[str]:
    """The CRD's CEL rules (x-kubernetes-validations) an object breaks, evaluated as the API
    server does on a create: each rule on the value at its node (``self``); transition rules
    (those reading ``oldSelf``) apply only to updates and are left out."""
    openapi = _openapi().get((obj["apiVersion"], obj["kind"]))
    found: list[str] = []
    for value, schema, path in nodes(obj, openapi) if openapi is not None else ():
        for validation in schema.get("x-kubernetes-validations", []):
            rule = validation["rule"]
            if "oldSelf" in rule:
                continue
            result = _cel_program(rule).evaluate({"self": celpy.json_to_cel(value)})
            if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
                found.append(f"{path or '(the object)'}: {validation.get('message', rule)}")
    return [f"{obj['kind']}/{obj['metadata']['name']}: {e}" for e in found]


def test_the_cel_check_finds_a_broken_rule() -> None:
    cluster: Obj = {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "c"},
        "spec": {
            "instances": 3,
            "imageName": "x",
            "imageCatalogRef": {"apiGroup": "postgresql.cnpg.io", "kind": "ImageCatalog"},
            "postgresql": {"synchronous": {"method": "any", "number": 0}},
        },
    }
    assert cel_errors(cluster) == [
        "Cluster/c: spec: imageName and imageCatalogRef are mutually exclusive",
        "Cluster/c: spec.postgresql.synchronous.number: "
        "The number of synchronous replicas should be greater than zero",
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_objects_keep_their_crds_cel_rules(overlay: str) -> None:
    found = [e for obj in custom_objects(overlay) for e in cel_errors(obj)]
    assert not found, "\n".join(found)
