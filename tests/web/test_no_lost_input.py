"""The page acts on every tap and every drag of its person, whatever arrives meanwhile.

It lost two kinds (both fixed in web/; ``act`` in play.py gave a lost input again, which hid
them, and gives each input once now):

- An input while the person's own command was unanswered. The socket's event frame (with the
  view after the command) can reach the page before the HTTP answer of that command: the page
  shows the person's next turn while the command is still in flight, and the old ``send``
  returned at once when one was (``if (S.busy) return``). Ana draws, the socket shows her turn
  to discard, she taps her card twice (or drags it): nothing sent, nothing shown. The page now
  keeps that input and sends it as soon as the answer is in.
- A press (pointer down, then up) during which the page was drawn again. Every render built the
  hand anew: the card pressed was replaced by a new element, and the browser sends the click to
  what the two have in common (the hand), not to a card. Cards and buttons that stay on the
  page now stay the same elements.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.web.conftest import Person, Stack
from tests.web.play import Relay, bia_moves, to_anas_discard


def to_anas_draw(ana: Person, stack: Stack, table: str, bia: str) -> None:
    """Play on until Ana is to draw (she discards her first card; Bia draws and discards)."""
    to_anas_discard(ana, stack, table, bia)
    card = ana.shown("cards")[0]
    target = ana.page.locator(f"#hand .card[data-card='{card}']")
    before = ana.shown("version")
    target.click()
    target.click()
    ana.wait(f"p.version > {before} && p.to_act === 1")
    for step in (1, 2):
        bia_moves(stack, table, bia)
        ana.wait(f"p.version > {before + step}")
    ana.wait("p.to_act === 0 && p.phase === 'draw'")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["tap", "drag"])
def test_an_input_while_the_own_command_is_unanswered_is_sent_after_it(
    two: tuple[Person, str, str, Relay], stack: Stack, how: str
) -> None:
    ana, table, bia, _ = two
    to_anas_draw(ana, stack, table, bia)
    drawn_from = ana.shown("version")

    # Ana's draw is applied (and the socket tells the page) but its HTTP answer is held.
    held: list[tuple[Any, Any]] = []

    def hold(route: Any) -> None:
        if held:
            route.fallback()
            return
        held.append((route, route.fetch()))

    ana.page.route(lambda url: url.endswith(f"/v1/tables/{table}/commands"), hold)
    ana.page.locator("#stock").click()
    ana.wait(f"p.version > {drawn_from} && p.phase === 'discard' && p.busy")
    assert len(held) == 1

    card = ana.shown("cards")[0]
    target = ana.page.locator(f"#hand .card[data-card='{card}']")
    if how == "drag":
        target.drag_to(ana.page.locator("#discard"))
    else:
        target.click()
        target.click()
    ana.page.wait_for_timeout(200)
    route, answer = held[0]
    route.fulfill(response=answer)
    ana.wait(f"p.version > {drawn_from + 1} && p.to_act === 1", timeout_ms=5_000)
    assert ana.shown("top") == card
    assert ana.shown("notice") is None, ana.seen()


@pytest.mark.timeout(120)
def test_a_tap_whose_press_spans_a_redraw_is_acted_on(
    two: tuple[Person, str, str, Relay], stack: Stack
) -> None:
    ana, table, bia, relay = two
    to_anas_discard(ana, stack, table, bia)
    card = ana.shown("cards")[0]
    box = ana.page.locator(f"#hand .card[data-card='{card}']").bounding_box()
    assert box is not None
    ana.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    ana.page.mouse.down()
    # The socket closes and opens again under the pressed card: its snapshot draws the page.
    connections = ana.shown("snapshots")
    relay.drop()
    ana.wait(f"p.snapshots > {connections}")
    ana.page.mouse.up()
    ana.wait(f"p.selected === {card!r}", timeout_ms=2_000)
