"""The lobby's "Minhas mesas" (issue 33, part 1) in Chromium: Ana's tables, her turn first, kept
current by the player socket: a move by her opponent makes a row hers without a reload.
Screens: test-output/web/mytables-*.png."""

from __future__ import annotations

from typing import Any

import requests

from shared.contracts.api import LIST_LIMIT
from tests.web.conftest import DESKTOP, Person, Stack
from tests.web.play import bia_moves, sign_in

ROWS = "#my-tables-list li"


def post(stack: Stack, path: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = requests.post(
        f"{stack.base}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code in (200, 201), answer.text
    return dict(answer.json())


def to_act(stack: Stack, table: str) -> int:
    view = requests.get(f"{stack.base}/v1/tables/{table}", timeout=10).json()
    return int(view["hand"]["to_act"])


def table_of(stack: Stack, creator: str, joiner: str) -> str:
    created = post(stack, "/v1/tables", creator, {"options": {}})
    post(
        stack,
        f"/v1/tables/{created['table_id']}/join",
        joiner,
        {"invite_code": created["invite_code"]},
    )
    return str(created["table_id"])


def until_turn(stack: Stack, table: str, tokens: list[str], seat: int) -> None:
    """Whoever is to act moves (never ending the hand) until ``seat`` has the decision."""
    for _ in range(20):
        acting = to_act(stack, table)
        if acting == seat:
            return
        bia_moves(stack, table, tokens[acting])
    raise AssertionError(f"seat {seat} never came to act at {table}")


def rows(ana: Person) -> list[dict[str, str]]:
    return list(
        ana.page.evaluate(
            """(sel) => [...document.querySelectorAll(sel)].map((li) => ({
                table: li.dataset.table, mine: li.dataset.myTurn, status: li.dataset.status,
                text: li.textContent}))""",
            ROWS,
        )
    )


def test_my_tables_in_the_lobby_my_turn_first_and_kept_current(people: Any, stack: Stack) -> None:
    ana: Person = people(DESKTOP, "ana")
    ana.page.goto(f"{stack.base}/")
    sign_in(ana, "Ana")
    ana.page.locator("#my-tables-empty").wait_for(state="visible")  # none yet
    me = ana.token()
    bia = requests.post(f"{stack.base}/v1/dev/tokens", json={"name": "Bia"}, timeout=10).json()
    bia_token = bia["token"]
    # Ana's turn at one (she joined Bia's), Bia's at another (Ana's own), one waiting.
    hers = table_of(stack, bia_token, me)
    until_turn(stack, hers, [bia_token, me], 1)
    theirs = table_of(stack, me, bia_token)
    until_turn(stack, theirs, [me, bia_token], 1)
    waiting = post(stack, "/v1/tables", me, {"options": {}})["table_id"]

    ana.page.wait_for_function(f"() => document.querySelectorAll({ROWS!r}).length === 3")
    shown = rows(ana)
    assert [r["table"] for r in shown] == [hers, theirs, waiting], shown
    assert shown[0]["mine"] == "true"
    assert "Sua vez" in shown[0]["text"]
    assert "contra Bia" in shown[0]["text"]
    assert "Vez de Bia" in shown[1]["text"]
    assert "Esperando adversário" in shown[2]["text"]
    assert ana.page.get_by_role("heading", name="Minhas mesas").is_visible()
    ana.shot("mytables-01-lista")

    # Bia moves at Ana's own table until it is Ana's turn: the row becomes hers, no reload.
    until_turn(stack, theirs, [me, bia_token], 0)
    ana.page.wait_for_function(
        f"() => document.querySelector('{ROWS}[data-table=\"{theirs}\"]').dataset.myTurn === 'true'"
    )
    shown = rows(ana)
    assert [r["mine"] for r in shown[:2]] == ["true", "true"], shown
    assert shown[2]["table"] == waiting
    ana.shot("mytables-02-minha-vez")

    # A row is the table's link.
    ana.page.locator(f'{ROWS}[data-table="{hers}"] a').click()
    ana.wait(f"p.table === {hers!r} && p.status === 'playing'")


def test_more_tables_than_the_sockets_first_page_are_all_listed(people: Any, stack: Stack) -> None:
    """The player socket's first frame holds the list's first page (20 tables); the page reads
    the later pages itself: a correspondence player with more tables sees them all."""
    ana: Person = people(DESKTOP, "ana")
    ana.page.goto(f"{stack.base}/")
    sign_in(ana, "Ana")
    ana.page.locator("#my-tables-empty").wait_for(state="visible")
    me = ana.token()
    made = (post(stack, "/v1/tables", me, {"options": {}}) for _ in range(LIST_LIMIT + 3))
    tables = {created["table_id"] for created in made}
    ana.page.reload()  # the lobby's socket opened again, once the tables exist
    ana.page.wait_for_function(
        f"() => document.querySelectorAll({ROWS!r}).length === {len(tables)}"
    )
    assert {r["table"] for r in rows(ana)} == tables
