"""The page never shows an older view of its table than the one it shows already.

A view the page reads again (after a 409, or on ``absence_claimable``) and a socket's snapshot
are the table as it was when they were read. A move of the page's person answered meanwhile,
on another request, is newer: shown over it, the late answer puts the person back in the turn
she has just played (to discard again after her discard), and her next input is made from that.
So test_against_tito can fail (it did once, "draw a card first"): an input is lost, ``act``
waits 7.5 s and gives it again, and past the 6 s absence time ``absence_claimable`` comes, whose
read of the view is answered after the discard given again. The next discard is dragged from
the older view; TITO's turn comes on the socket during the drag, and the drop sends it at the
table's new version, Ana's draw.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests

from tests.web.conftest import DESKTOP, Person, Stack
from tests.web.play import MY_TURN, act, create_table, sign_in, version

SOCKET = re.compile(r"/v1/tables/[^/]+/ws")


def bia_moves(stack: Stack, table: str, token: str) -> None:
    """Bia (no window) makes her decision: pass, draw from the stock, or her SOBRA's discard
    (never ending the hand)."""
    headers = {"Authorization": f"Bearer {token}"}
    view = requests.get(f"{stack.base}/v1/tables/{table}", headers=headers, timeout=10).json()
    hand = view["hand"]
    if hand["phase"] == "upcard":
        move: dict[str, Any] = {"type": "pass_upcard"}
    elif hand["phase"] == "draw":
        move = {"type": "draw", "source": "stock"}
    else:
        card = hand["my_arrangement"].get("discard") or hand["my_cards"][0]
        move = {"type": "discard", "card": card}
    move["expected_version"] = view["version"]
    answer = requests.post(
        f"{stack.base}/v1/tables/{table}/commands", json=move, headers=headers, timeout=10
    )
    assert answer.status_code == 200, answer.text


def to_anas_discard(ana: Person, stack: Stack, table: str, bia: str) -> None:
    """Play (Ana in her window, Bia by the API) until Ana has drawn and is to discard."""
    for _ in range(20):
        hand = ana.state(".view.hand")
        if hand["to_act"] == 0 and hand["phase"] == "discard":
            return
        if hand["to_act"] == 0:
            act(ana, knock=False)
        else:
            before = version(ana)
            bia_moves(stack, table, bia)
            ana.wait(f"s.view.version > {before}")
    raise AssertionError(f"Ana never came to discard: {ana.seen()}")


@pytest.fixture
def two(people: Any, stack: Stack) -> tuple[Person, str, str]:
    """Ana's window at a table she plays against Bia (a token, no window): Ana, table, Bia."""
    ana: Person = people(DESKTOP, "ana")
    ana.page.goto(f"{stack.base}/")
    sign_in(ana, "Ana")
    table = create_table(ana)
    invite = ana.page.locator("#invite-link").input_value().rpartition("=")[2]
    bia = requests.post(f"{stack.base}/v1/dev/tokens", json={"name": "Bia"}, timeout=10).json()
    joined = requests.post(
        f"{stack.base}/v1/tables/{table}/join",
        json={"invite_code": invite},
        headers={"Authorization": f"Bearer {bia['token']}"},
        timeout=10,
    )
    assert joined.status_code == 200, joined.text
    ana.wait("s.view.status === 'playing' && s.view.hand !== null")
    return ana, table, bia["token"]


@pytest.mark.timeout(120)
def test_a_view_read_before_a_move_is_not_shown_after_it(
    two: tuple[Person, str, str], stack: Stack
) -> None:
    ana, table, bia = two
    to_anas_discard(ana, stack, table, bia)
    drawn = version(ana)

    # The page reads the view again (after a refusal: a draw when she has drawn already), and
    # that read's answer is held until Ana's discard has been answered.
    held: list[tuple[Any, Any]] = []

    def hold(route: Any) -> None:
        if route.request.method != "GET":
            route.fallback()
            return
        held.append((route, route.fetch()))  # read now, at the version before the discard

    ana.page.route(lambda url: url.endswith(f"/v1/tables/{table}"), hold)
    ana.page.locator("#stock").click()
    ana.page.locator("#notice").wait_for(state="visible")
    ana.wait("!s.busy")
    ana.page.wait_for_timeout(200)
    assert len(held) == 1, "the page did not read the view again after the refusal"
    assert held[0][1].json()["version"] == drawn

    assert act(ana, knock=False) in ("discard", "drag")
    discarded = version(ana)
    assert discarded == drawn + 1
    route, answer = held[0]
    route.fulfill(response=answer)
    ana.page.wait_for_timeout(500)  # the late answer is in
    assert version(ana) == discarded, f"the page went back to version {version(ana)}"
    assert ana.state(".view.hand.phase") == "draw"
    assert ana.state(".view.hand.to_act") == 1, ana.seen()  # Bia's draw now


@pytest.mark.timeout(120)
def test_a_snapshot_read_before_a_move_is_not_shown_after_it(
    two: tuple[Person, str, str], stack: Stack
) -> None:
    ana, table, bia = two
    to_anas_discard(ana, stack, table, bia)
    drawn = version(ana)

    # Ana's socket reconnects; its snapshot (read at once, before her discard) reaches the
    # page only after her discard was answered.
    snapshots: list[str] = []
    sockets: list[tuple[Any, Any]] = []

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            text = message if isinstance(message, str) else message.decode()
            if '"kind":"snapshot"' in text and not snapshots:
                snapshots.append(text)  # held
                return
            ws.send(message)

        server.on_message(from_server)
        sockets.append((ws, server))

    ana.context.route_web_socket(SOCKET, relay)
    connections = ana.state(".snapshots")
    ana.page.evaluate("() => window.gin.state.socket.ws.close()")  # reconnects by itself
    ana.page.wait_for_timeout(100)
    for _ in range(100):
        if snapshots:
            break
        ana.page.wait_for_timeout(50)
    assert snapshots, "the page's socket did not reconnect"
    assert f'"version":{drawn},' in snapshots[0]

    assert act(ana, knock=False) in ("discard", "drag")
    discarded = version(ana)
    assert discarded == drawn + 1
    page_side, _ = sockets[-1]
    page_side.send(snapshots[0])
    ana.wait(f"s.snapshots > {connections}")
    ana.page.wait_for_timeout(300)
    assert version(ana) == discarded, f"the page went back to version {version(ana)}"
    assert ana.page.evaluate(f"() => {{ const s = window.gin.state; return !({MY_TURN}); }}")
