"""The page never shows an older view of its table than the one it shows already.

A view the page reads again (after a 409, or on ``absence_claimable``) and a socket's snapshot
are the table as it was when they were read. A move of the page's person answered meanwhile,
on another request, is newer: shown over it, the late answer puts the person back in the turn
she has just played (to discard again after her discard), and her next input is made from that.
So test_against_tito failed once ("draw a card first"): a late read of the view, answered
after Ana's discard, put her back to discard; the next discard was dragged from that older view,
TITO's turn came on the socket during the drag, and the drop sent it at the table's new
version, Ana's draw.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests

from tests.web.conftest import DESKTOP, Person, Stack
from tests.web.play import act, create_table, sign_in, version

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
        shown = ana.shown()
        if shown["to_act"] == 0 and shown["phase"] == "discard":
            return
        if shown["to_act"] == 0:
            act(ana, knock=False)
        else:
            before = shown["version"]
            bia_moves(stack, table, bia)
            ana.wait(f"p.version > {before}")
    raise AssertionError(f"Ana never came to discard: {ana.seen()}")


class Relay:
    """Stands between Ana's window and the table socket: ``drop()`` closes the socket under
    the page (it reconnects by itself); with ``hold``, the next snapshot is kept in ``held``
    instead of reaching the page, until the test sends it."""

    def __init__(self) -> None:
        self.hold = False
        self.held: list[str] = []
        self.sockets: list[tuple[Any, Any]] = []

    def route(self, ws: Any) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            text = message if isinstance(message, str) else message.decode()
            if self.hold and '"kind":"snapshot"' in text and not self.held:
                self.held.append(text)
                return
            ws.send(message)

        server.on_message(from_server)
        self.sockets.append((ws, server))

    def drop(self) -> None:
        page_side, server_side = self.sockets[-1]
        page_side.close(code=1011, reason="the network is down")
        server_side.close()


@pytest.fixture
def two(people: Any, stack: Stack) -> tuple[Person, str, str, Relay]:
    """Ana's window at a table she plays against Bia (a token, no window): Ana, table, Bia, and
    the relay of Ana's socket."""
    ana: Person = people(DESKTOP, "ana")
    relay = Relay()
    ana.context.route_web_socket(SOCKET, relay.route)
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
    ana.wait("p.status === 'playing' && p.phase !== null")
    return ana, table, bia["token"], relay


@pytest.mark.timeout(120)
def test_a_view_read_before_a_move_is_not_shown_after_it(
    two: tuple[Person, str, str, Relay], stack: Stack
) -> None:
    ana, table, bia, _ = two
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
    ana.wait("!p.busy")
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
    assert ana.shown("phase") == "draw"
    assert ana.shown("to_act") == 1, ana.seen()  # Bia's draw now


@pytest.mark.timeout(120)
def test_a_snapshot_read_before_a_move_is_not_shown_after_it(
    two: tuple[Person, str, str, Relay], stack: Stack
) -> None:
    ana, table, bia, relay = two
    to_anas_discard(ana, stack, table, bia)
    drawn = version(ana)

    # Ana's socket reconnects; its snapshot (read at once, before her discard) reaches the
    # page only after her discard was answered.
    relay.hold = True
    connections = ana.shown("snapshots")
    relay.drop()  # the page reconnects by itself
    for _ in range(100):
        if relay.held:
            break
        ana.page.wait_for_timeout(50)
    assert relay.held, "the page's socket did not reconnect"
    assert f'"version":{drawn},' in relay.held[0]

    assert act(ana, knock=False) in ("discard", "drag")
    discarded = version(ana)
    assert discarded == drawn + 1
    page_side, _ = relay.sockets[-1]
    page_side.send(relay.held[0])
    ana.wait(f"p.snapshots > {connections}")
    ana.page.wait_for_timeout(300)
    assert version(ana) == discarded, f"the page went back to version {version(ana)}"
    shown = ana.shown()
    assert not (shown["to_act"] == shown["you"] == 0), ana.seen()
