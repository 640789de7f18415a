"""A person creates a Hollywood table (R9.6) from the page's form and plays it against TITO to
its end: the felt, the end-of-hand board and the match-end board draw the three columns
(R9.11). Screenshots: test-output/web/40-hollywood-*.png."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.web.conftest import PHONE, Person, Stack
from tests.web.play import act, board_open, sign_in

TARGET = 10  # small: a gin closes every game it goes into


def columns_fit(person: Person) -> None:
    """Nothing is wider than the phone's screen."""
    assert person.page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]


@pytest.mark.timeout(300)
def test_r9_11_a_hollywood_match_against_tito_draws_the_three_columns(
    people: Any, stack: Stack
) -> None:
    ana: Person = people(PHONE, "ana-hollywood")
    page = ana.page
    page.goto(f"{stack.base}/")
    sign_in(ana, "Ana")
    form = page.locator("#create-form")
    form.locator("input[name=target]").fill(str(TARGET))
    hollywood = form.locator("input[name=hollywood]")
    assert not hollywood.is_checked()  # off by default (R9.6)
    label = form.locator("label", has=page.locator("input[name=hollywood]"))
    assert label.inner_text().strip() == "Hollywood"
    assert "Três partidas ao mesmo tempo" in form.locator(".option-help").inner_text()
    hollywood.check()
    ana.shot("40-hollywood-opcao")
    form.get_by_role("button", name="CRIAR MESA").click()
    ana.wait("p.status === 'waiting'")
    assert ana.view()["options"]["hollywood"] is True
    assert "Hollywood" in page.locator("#options-line").inner_text()
    page.locator("#waiting [data-level=tito]").click()
    ana.wait("p.status === 'playing'")

    sheet = page.locator("#games .sheet")
    sheet.wait_for(state="visible")
    assert sheet.locator("th[data-game]").all_inner_texts() == ["Jogo 1", "Jogo 2", "Jogo 3"]
    assert sheet.locator("tr[data-seat='0'] td").all_inner_texts() == ["0 pts · 0 mãos"] * 3
    columns_fit(ana)
    ana.shot("41-hollywood-colunas")

    shots: set[str] = set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if board_open(ana):
            if page.locator("#board .match-board").count():
                break
            board = page.locator("#board .hand-board")
            if board.locator(".sheet").count() and "fim-da-mao" not in shots:
                assert board.locator(".sheet th[data-game]").count() == 3
                if board.locator(".board-scored-in").count():
                    shots.add("fim-da-mao")
                    columns_fit(ana)
                    ana.shot("42-hollywood-fim-da-mao")
            page.locator("#board [data-action=close-board]").click()
            continue
        if "jogo-fechado" not in shots and sheet.locator("th.closed").count():
            shots.add("jogo-fechado")
            ana.shot("43-hollywood-um-jogo-fechado")
        if act(ana) == "wait":
            time.sleep(0.05)
    else:
        pytest.fail("the Hollywood match did not end in time")

    # The match-end board: three closed columns, a tally per game and their sum (R9.11).
    result = ana.view()["match"]["result"]
    assert result["reason"] == "target"
    assert [g["closed"] for g in result["games"]] == [True, True, True]
    board = page.locator("#board .match-board")
    assert board.locator(".sheet td.closed").count() == 3 * 3  # two seats and the status row
    tally = board.locator(".hollywood-tally")
    heads = tally.locator("tr").first.locator("th").all_inner_texts()
    assert heads == ["", "Jogo 1", "Jogo 2", "Jogo 3", "Soma"]
    for seat in (0, 1):
        cells = tally.locator(f"tr.total[data-seat='{seat}'] td").all_inner_texts()
        by_game = [g["tally"][seat]["total"] for g in result["games"]]
        assert cells == [str(x) for x in [*by_game, result["tally"][seat]["total"]]]
    columns_fit(ana)
    winner = result["winner"]
    assert "venceu" in board.locator(".board-how").inner_text()
    assert ["Ana", "TITO"][winner] in board.locator(".board-how").inner_text()
    ana.shot("44-hollywood-fim-da-partida")
    assert "fim-da-mao" in shots, "no end-of-hand board showed the columns"
