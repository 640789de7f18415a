"""The prod edge (deploy/k8s/overlays/prod/ingress.yaml): every public route of
docs/openapi.yaml reaches the service that serves it, no ops route is public, and every public
Ingress limits each client before Python sees a request."""

from __future__ import annotations

import re
from typing import Any

from tests.deploy.test_contract_docs import committed
from tests.deploy.test_manifests import of_kind, rendered

SAMPLE_ID = "Ab3_x-Q9zK1m"
LIMITS = ("limit-connections", "limit-rps")


def backend(ingresses: list[Any], path: str) -> str | None:
    """The service ingress-nginx sends ``path`` to: a regex path of an Ingress that uses
    regexes first (longest first), then the longest Prefix match."""
    regex, prefix = [], []
    for ing in ingresses:
        uses_regex = (
            ing["metadata"].get("annotations", {}).get("nginx.ingress.kubernetes.io/use-regex")
        )
        for rule in ing["spec"]["rules"]:
            for p in rule["http"]["paths"]:
                name = p["backend"]["service"]["name"]
                if uses_regex == "true":
                    regex.append((p["path"], name))
                elif p["pathType"] == "Prefix":
                    prefix.append((p["path"], name))
    for pattern, name in sorted(regex, key=lambda x: -len(x[0])):
        if re.match(pattern, path):
            return name
    for start, name in sorted(prefix, key=lambda x: -len(x[0])):
        if path == start.rstrip("/") or path.startswith(start.rstrip("/") + "/"):
            return name
    return None


def public_routes() -> dict[str, str]:
    """Each documented path (a sample id in it) and the service whose tag it has."""
    routes = {}
    for path, item in committed("openapi.yaml")["paths"].items():
        for operation in item.values():
            if not isinstance(operation, dict) or "tags" not in operation:
                continue
            tag = operation["tags"][0]
            sample = re.sub(r"\{[^}]+\}", lambda m: "3" if m.group(0) == "{n}" else SAMPLE_ID, path)
            routes[sample] = tag
    return routes


def test_every_public_route_reaches_its_service_and_no_ops_route_is_public() -> None:
    ingresses = of_kind(rendered("prod"), "Ingress")
    assert ingresses
    for path, tag in public_routes().items():
        found = backend(ingresses, path)
        if path.startswith("/v1/dev/"):
            continue  # reaches the table service, which serves no such route in prod
        if tag == "ops":
            assert found is None, f"{path} is public"
        else:
            assert found == f"gin-{tag}", f"{path}: {found}, not gin-{tag}"


def test_every_public_ingress_limits_each_client_and_speaks_tls() -> None:
    for ing in of_kind(rendered("prod"), "Ingress"):
        annotations = ing["metadata"]["annotations"]
        for limit in LIMITS:
            value = annotations[f"nginx.ingress.kubernetes.io/{limit}"]
            assert int(value) > 0, (ing["metadata"]["name"], limit)
        assert ing["spec"]["tls"], ing["metadata"]["name"]


def test_the_table_service_is_reached_by_table_affinity() -> None:
    (table,) = [
        i for i in of_kind(rendered("prod"), "Ingress") if i["metadata"]["name"] == "gin-table"
    ]
    assert table["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-hash-by"]


def test_sockets_are_limited_per_address_apart_and_keep_table_affinity() -> None:
    """Issue 31, part 5: a spectator's socket carries no token, so only its address bounds
    it: the socket route has an Ingress of its own, whose limits count sockets held and
    opened per address, apart from plain requests."""
    ingresses = of_kind(rendered("prod"), "Ingress")
    path = f"/v1/tables/{SAMPLE_ID}/ws"
    assert backend(ingresses, path) == "gin-table"
    holding = [
        ing
        for ing in ingresses
        for rule in ing["spec"]["rules"]
        for p in rule["http"]["paths"]
        if re.fullmatch(p["path"].rstrip("$"), path)
    ]
    (sockets,) = holding
    annotations = sockets["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    held = int(annotations[prefix + "limit-connections"])
    assert 0 < held <= 100
    assert 0 < int(annotations[prefix + "limit-rps"]) < held
    assert annotations[prefix + "upstream-hash-by"] == "$gin_table"
    assert int(annotations[prefix + "proxy-read-timeout"]) >= 60  # past the 30 s heartbeat
