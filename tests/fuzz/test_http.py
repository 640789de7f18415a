"""schemathesis against docs/openapi.yaml on the real table and chat services.

Every operation of the document gets cases in all of schemathesis's phases (the document's
examples, its coverage cases of each boundary, then hypothesis fuzzing), positive and
negative. Each case is sent to the service that serves its route, and every answer must be:
- never a 5xx;
- a status, content type, headers and body the document gives that operation;
- for a 4xx, exactly ``{"error": {"code": str, "message": str, "rule": str | null}}``;
- for a refusal naming one of our real tables, no change: the table's version, its number of
  events and its last chat message are what they were before the request.

The valid parts of the cases are steered toward what exists (``steer``): most name a real
table, carry a real token or a hostile one, the real invitation code, now and then a legal
move, so the fuzz gets past 401 and 404 to the handlers' own checks; now and then one valid
part gets an input that once answered 500 (``CLASSICS``). The parts schemathesis made invalid
stay as made. The steering is a pure function of the case, so a failure replays as it ran.

The run is bounded and repeatable: deterministic generation (the same cases on every run, so
a red CI is a failure that replays on any machine, not a lucky draw) and a fixed number of
examples per operation; ``GIN_FUZZ_EXAMPLES`` raises it for a longer search by hand.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jwt
import pytest
import schemathesis
from requests.structures import CaseInsensitiveDict
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.fuzz.conftest import Services, World, assert_error_shape
from tests.fuzz.tally import ANSWERS, CASES

Case = schemathesis.Case[Any]
DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
EXAMPLES = int(os.environ.get("GIN_FUZZ_EXAMPLES", "40"))
CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 13,
        "generation": {
            "mode": "all",
            "max-examples": EXAMPLES,
            "deterministic": True,
        },
    }
)
schema = schemathesis.openapi.from_path(DOCUMENT, config=CONFIG)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def world(services: Services) -> World:
    return World(services, "http")


def _pick(case: Case, salt: str, weights: dict[str, int]) -> str:
    """A choice that is a pure function of the case (so a failure replays as it ran)."""
    seed = repr(
        (case.method, case.path, case.path_parameters, case.query, dict(case.headers), case.body)
    )
    digest = hashlib.sha256(f"{salt}:{seed}".encode(errors="surrogatepass")).digest()
    point = int.from_bytes(digest[:8], "big") % sum(weights.values())
    for choice, weight in weights.items():
        if point < weight:
            return choice
        point -= weight
    raise AssertionError("unreachable")


def hostile_tokens(world: World, secret: str) -> list[str]:
    """Authorization headers no caller should get past 401 with."""
    ana = world.tokens["ana"]
    head, payload, signature = ana.split(".")
    return [
        "Bearer \xff\xfe",  # raw bytes (latin-1 on the wire, not UTF-8)
        "Bearer " + ana + "\xe9",
        "Bearer " + ".".join([head, payload, signature[::-1]]),  # a wrong signature
        "Bearer " + jwt.encode({"sub": "fuzz-x", "name": "X"}, secret, algorithm="HS256"),
        "Bearer " + jwt.encode({"sub": "fuzz-x", "exp": 1}, secret, algorithm="HS256"),
        "Bearer " + jwt.encode({"sub": "fuzz-x", "exp": 4102444800}, "another-secret-" * 3),
        "Bearer " + jwt.encode({"sub": "fuzz-x", "exp": 4102444800}, None, algorithm="none"),
        "Bearer " + jwt.encode({"sub": 7, "exp": 4102444800}, secret, algorithm="HS256"),
        "Bearer " + "a" * 4000,
        "Bearer a.b.c",
        "Basic YW5hOmFuYQ==",
        "bearer",
        "Bearer  " + ana,
    ]


# Moves the steering never picks (the fuzz makes them itself, and the table is then replaced).
ENDS_THE_MATCH = {"resign", "leave", "decline_rematch"}


def negative(case: Case, location: ParameterLocation) -> bool:
    """Whether schemathesis made this part of the case invalid on purpose."""
    return case.meta is not None and case.meta.is_negative_at(location)


def legal_move(case: Case, world: World, who: str) -> dict[str, Any] | None:
    """Now and then one of the seat's legal moves, so the match goes on and the fuzz meets
    its later states (a knock, a hand's end, a record)."""
    if _pick(case, "move", {"as made": 3, "legal": 1}) == "as made":
        return None
    view = world.view(world.seated, who)
    legal = [m for m in view.get("legal", []) if m["type"] not in ENDS_THE_MATCH]
    if not legal:
        return None
    move: dict[str, Any] = legal[int(_pick(case, "which", {str(i): 1 for i in range(len(legal))}))]
    return move


def steer(case: Case, world: World, secret: str) -> None:
    """Point the case at a real table, a real token or a hostile one, the real invitation.

    Only a part schemathesis made valid is steered: a negative part stays as it was made (it
    is what that case is about). Each is assigned anew, never edited in place, so
    schemathesis checks the case again before it is sent.
    """
    if "id" in case.path_parameters and not negative(case, ParameterLocation.PATH):
        target = _pick(case, "table", {"as made": 1, "seated": 5, "waiting": 2, "finished": 1})
        table_id = getattr(world, target, None)
        if table_id is not None:
            case.path_parameters = {**case.path_parameters, "id": table_id}
    who = _pick(
        case,
        "token",
        {"as made": 2, "ana": 4, "bia": 2, "cid": 2, "none": 1, "hostile": 2},
    )
    body = case.body if isinstance(case.body, dict) else None
    if body is not None and not negative(case, ParameterLocation.BODY):
        steered = steer_body(case, world, who, body)
        if steered is not body:
            case.body = steered
    headers = CaseInsensitiveDict(case.headers or {})
    if who in world.tokens:
        headers["Authorization"] = f"Bearer {world.tokens[who]}"
    elif who == "none":
        headers.pop("Authorization", None)
    elif who == "hostile":
        hostile = hostile_tokens(world, secret)
        which = _pick(case, "which", {str(i): 1 for i in range(len(hostile))})
        headers["Authorization"] = hostile[int(which)]
    if who != "as made" and not negative(case, ParameterLocation.HEADER):
        case.headers = headers


def steer_body(case: Case, world: World, who: str, body: dict[str, Any]) -> dict[str, Any]:
    """The real invitation code, a message the chat takes, a legal move: now and then."""
    table_id = case.path_parameters.get("id")
    if "invite_code" in body and _pick(case, "invite", {"as made": 1, "real": 1}) == "real":
        code = world.seated_invite if table_id == world.seated else world.invite
        return {**body, "invite_code": code}
    if "text" in body and _pick(case, "text", {"as made": 2, "real": 1}) == "real":
        return {"text": "bom jogo!"}  # the chat's 201 (and, five at a time, its 429)
    commands = case.operation.label == "POST /v1/tables/{id}/commands"
    if commands and table_id == world.seated and who in ("ana", "bia"):
        return legal_move(case, world, who) or body
    return body


# Values that once answered 500 or that a lax parser takes (issue 13), put now and then in
# one valid part of a case: schemathesis rarely makes exactly these.
CLASSICS: dict[tuple[ParameterLocation, str], list[Any]] = {
    (ParameterLocation.PATH, "id"): ["a\x00b", "é" * 12, "x" * 65, "abc\n", "%", " x"],
    (ParameterLocation.PATH, "n"): ["2147483648", "0", "-1", "١", "1_0", " 1", "9" * 30],
    (ParameterLocation.QUERY, "after"): ["9223372036854775808", "-1", "١٢", "1_0", " 1", "1e3"],
    (ParameterLocation.QUERY, "limit"): ["0", "9223372036854775808", "-5", "1.5", "٣"],
    (ParameterLocation.BODY, "invite_code"): ["é" * 22, "a\x00b", "x" * 65, "", "a\n"],
    (ParameterLocation.BODY, "command_id"): ["a\x00b", "é", "x" * 101, "a\n", ""],
    (ParameterLocation.BODY, "expected_version"): [2**63, 2**31, -1, 1.5, "1"],
    (ParameterLocation.BODY, "text"): ["\x00", "a\x00b", " ", "x" * 501, "\ud800"],
    (ParameterLocation.BODY, "deck_design"): ["a\x00", "É", "a" * 41],
}


def classic(case: Case) -> None:
    """Now and then, one valid part of the case gets one of the ``CLASSICS``."""
    if _pick(case, "classic", {"no": 3, "yes": 1}) == "no":
        return
    containers = {
        ParameterLocation.PATH: case.path_parameters,
        ParameterLocation.QUERY: case.query,
        ParameterLocation.BODY: case.body if isinstance(case.body, dict) else None,
    }
    slots = [
        (location, name)
        for (location, name) in CLASSICS
        if not negative(case, location) and name in (containers[location] or {})
    ]
    slots += [(ParameterLocation.QUERY, n) for n in ("after", "limit") if has_query(case, n)]
    if not slots:
        return
    location, name = slots[int(_pick(case, "slot", {str(i): 1 for i in range(len(slots))}))]
    values = CLASSICS[(location, name)]
    value = values[int(_pick(case, "value", {str(i): 1 for i in range(len(values))}))]
    if location == ParameterLocation.PATH:  # path parameters are sent as they stand
        case.path_parameters = {**case.path_parameters, name: quote(str(value), safe="")}
    elif location == ParameterLocation.QUERY:
        case.query = {**(case.query or {}), name: value}
    else:
        case.body = {**containers[location], name: value}  # type: ignore[dict-item]


def has_query(case: Case, name: str) -> bool:
    """Whether the operation takes this query parameter (the case may leave it out)."""
    return not negative(case, ParameterLocation.QUERY) and any(
        p.name == name for p in case.operation.query
    )


def base_of(case: Case, services: Services) -> str:
    """The chat's routes go to the chat service; every other route to the table service."""
    return services.chat.base if "chat" in (case.operation.tags or []) else services.table.base


@schema.parametrize()
def test_every_answer_is_a_clear_one(case: Case, services: Services, world: World) -> None:
    world.keep_playing()
    steer(case, world, services.settings.auth_secret)
    classic(case)
    base = base_of(case, services)
    table_id = str(case.path_parameters.get("id", ""))
    real = table_id in (world.seated, world.waiting, world.finished)
    before = world.state(table_id) if real else None
    response = case.call(base_url=base, session=world.http, timeout=30)
    CASES[f"http {'chat' if base == services.chat.base else 'table'}"] += 1
    ANSWERS[f"{case.method} {case.path}"][str(response.status_code)] += 1
    output = services.table.new_output() + services.chat.new_output()
    try:
        case.validate_response(response, checks=CHECKS)
    except BaseException as exc:  # the service's own account of a failure goes with it
        if response.status_code >= 500:
            exc.add_note(f"service output:\n{output[-6000:]}")
        raise
    status = response.status_code
    if 400 <= status < 500:
        assert_error_shape(status, response.content)
        if status == 429:
            retry_after = response.headers.get("retry-after", [])
            assert len(retry_after) == 1, response.headers
            assert retry_after[0].isdigit(), response.headers
        if before is not None:
            after = world.state(table_id)
            assert after == before, f"a refused {case.method} {case.path} changed the table"


def test_each_operation_is_an_item_of_its_own() -> None:
    # pytest-xdist hands items to its workers by node id: one id shared by every operation's
    # item ran only the first operation (tests/fuzz/conftest.py gives each its own).
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", __file__],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert collected.returncode == 0, collected.stdout[-2000:]
    name = test_every_answer_is_a_clear_one.__name__
    ids = [line for line in collected.stdout.splitlines() if f"::{name}" in line]
    assert len(ids) >= 15, collected.stdout[-2000:]
    assert len(set(ids)) == len(ids), ids
    assert all(item_id.endswith("]") and " /" in item_id for item_id in ids), ids
