"""The end-of-hand board of a real record (the engine's, from a rigged deal): laid-off cards
gold-bordered with AJUNTOU, the sentence of who laid off what, the server's knock discard."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.engine.helpers import after_first_draw, knock, play
from tests.web.conftest import DESKTOP, PHONE, Person, Stack

GOLD = "rgb(224, 164, 0)"


def undercut_with_layoffs() -> Any:
    """Ana knocks with 9 (the server picks her discard, Qd); Bia lays off 4c on Ac2c3c and
    7h then 8h on 4h5h6h, is left with 2, and undercuts."""
    state = after_first_draw(
        "4h 5h 6h 8c 8d 8s Ac 2c 3c 9d", "7h 8h 4c Kc Kd Ks Qs Js Ts 2d", drawn="Qd"
    )
    _, events = play(state, knock())
    return msgspec.to_builtins(events[0])


@pytest.mark.parametrize(("viewport", "name"), [(DESKTOP, "desktop"), (PHONE, "celular")])
def test_the_end_of_hand_board_shows_every_layoff(
    people: Any, stack: Stack, viewport: dict[str, int], name: str
) -> None:
    record = undercut_with_layoffs()
    assert record["how"] == "undercut"
    assert record["knock_discard_chosen_by_server"]
    viewer: Person = people(viewport, name)
    page = viewer.page
    page.goto(f"{stack.base}/")
    page.evaluate(
        """async (record) => {
            const { handBoard } = await import("/web/boards.js");
            const board = handBoard(record, ["Ana", "Bia"]);
            document.getElementById("board-content").replaceChildren(board);
            document.getElementById("board").hidden = false;
        }""",
        record,
    )
    board = page.locator("#board .hand-board")
    knocker = board.locator(".board-seat[data-seat='0']")
    laid = knocker.locator(".card.laid-off")
    assert laid.count() == 3
    assert sorted(laid.evaluate_all("cards => cards.map(c => c.dataset.card)")) == [
        "4c",
        "7h",
        "8h",
    ]
    for i in range(3):
        card = laid.nth(i)
        assert card.locator(".tag").inner_text() == "AJUNTOU"
        assert card.evaluate("c => getComputedStyle(c).borderTopColor") == GOLD
    assert board.locator(".board-seat[data-seat='1'] .card.laid-off").count() == 0
    text = board.inner_text()
    assert "Bia ajuntou 4♣, 7♥ e 8♥ aos jogos de Ana." in text
    assert "Sem escolher uma carta, o jogo descartou Q♦" in text
    assert "Ana bateu, mas levou undercut." in text
    assert "Bia fez 32 pontos." in text
    # Nothing of the board is outside the screen's width.
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= viewport["width"]
    viewer.shot(f"20-ajuntou-{name}")
