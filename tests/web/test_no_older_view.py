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

from typing import Any

import pytest

from tests.web.conftest import Person, Stack
from tests.web.play import Relay, act, to_anas_discard, version


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
