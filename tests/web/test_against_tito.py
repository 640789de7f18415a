"""A person plays a whole match against TITO on a phone-sized screen, to the end screen."""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

import pytest
import requests

from tests.web.conftest import PHONE, SHOTS, SOCKET, Person, Stack
from tests.web.play import MY_TURN, act, board_open, create_table, sign_in, version

# A short match: a whole one, to its end screen, in a reasonable time.
TARGET = 30


@pytest.mark.timeout(300)
def test_a_person_plays_a_whole_match_against_tito(people: Any, stack: Stack) -> None:
    ana: Person = people(PHONE, "ana")
    page = ana.page
    page.goto(f"{stack.base}/")
    ana.shot("01-entrada")
    sign_in(ana, "Ana")
    ana.shot("02-nova-mesa")

    # The deck design is the player's, kept by the server (R10.7).
    page.select_option("#deck-design", "quatro-cores")
    ana.wait("p.design === 'quatro-cores'")
    time.sleep(0.3)  # the PUT is on its way
    token = ana.token()
    prefs = requests.get(
        f"{stack.base}/v1/players/me/preferences",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()
    assert prefs == {"deck_design": "quatro-cores"}

    table = create_table(ana, target=TARGET, gin_bonus=20)
    assert page.locator("#options-line").inner_text().startswith(f"Partida até {TARGET} · gin 20 ")
    invite = page.locator("#invite-link").input_value()
    assert invite.startswith(f"{stack.base}/tables/{table}?invite=")
    ana.shot("03-mesa-esperando")

    page.locator("#waiting [data-level=tito]").click()
    ana.wait("p.status === 'playing'")
    assert page.locator("#seat-top").get_attribute("data-bot") == "tito"
    assert "TITO" in page.locator("#seat-top .seat-name").inner_text()
    page.reload()  # the design comes back with the view, from the server
    ana.wait("p.status === 'playing'")
    assert "deck-quatro-cores" in (page.locator("body").get_attribute("class") or "")

    # A refusal shows the server's own message: a move out of its phase, on Ana's turn.
    to_anas_turn(ana)
    played = ana.shown("match")
    shown = ana.shown()
    if shown["phase"] == "draw":  # a discard before drawing
        card = shown["cards"][0]
        command: dict[str, str] = {"type": "discard", "card": card}
        page.locator(f"#hand .card[data-card='{card}']").click()
        page.locator(f"#hand .card[data-card='{card}']").click()
    else:  # a draw while the upcard waits, or after drawing
        command = {"type": "draw", "source": "stock"}
        page.locator("#stock").click()
    notice = page.locator("#notice")
    notice.wait_for(state="visible")
    expected = requests.post(
        f"{stack.base}/v1/tables/{table}/commands",
        json=command,
        headers={"Authorization": f"Bearer {token}", "Accept-Language": "pt-BR"},
        timeout=10,
    ).json()["error"]["message"]  # the page asks for Portuguese, so it is told in Portuguese
    assert notice.inner_text() == f"Recusado: {expected}"

    # ORGANIZAR: the hand as the server arranges it (melds, the loose cards, SOBRA), or in
    # plain suit order.
    arrangement = ana.view()["hand"]["my_arrangement"]
    groups = page.locator("#hand .group")
    assert page.locator("#sobra").inner_text() == f"SOBRA {arrangement['points']}"
    assert page.locator("#hand .meld").count() == len(arrangement["melds"])
    page.locator("[data-action=organize]").click()
    assert groups.count() == 1
    assert page.locator("#hand .plain .card").count() == len(ana.shown("cards"))
    page.locator("[data-action=organize]").click()
    assert page.locator("#hand .meld").count() == len(arrangement["melds"])

    done: Counter[str] = Counter()
    shots: set[str] = set()
    restarted = 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        shown = ana.shown()
        if board_open(ana):
            kind = "fim-da-partida" if page.locator("#board .match-board").count() else "fim-da-mao"
            if kind not in shots:
                shots.add(kind)
                ana.shot(f"05-{kind}")
            if kind == "fim-da-partida":
                break
            page.locator("#board [data-action=close-board]").click()
            continue
        playing = shown["phase"] is not None
        discarding = shown["phase"] == "discard" and shown["to_act"] == 0
        if "jogando" not in shots and discarding:
            shots.add("jogando")
            ana.shot("04-jogando")
            # Usable on a 390 px phone: nothing wider than the screen, 11 cards all visible.
            assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
            boxes = [card.bounding_box() for card in page.locator("#hand .card").all()]
            assert len(boxes) == 11
            for i, a in enumerate(boxes):
                assert a is not None
                assert a["x"] >= 0
                assert a["x"] + a["width"] <= PHONE["width"]
                for b in boxes[i + 1 :]:  # no card over another
                    assert b is not None
                    apart_x = a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                    apart_y = a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
                    assert apart_x or apart_y, (a, b)
        if playing and not restarted and shown["to_act"] == 0:
            # The table service restarts mid-match (at Ana's first turn of the loop: a match
            # can end within its first hand, a gin of TITO's before three discards): the
            # page's socket closes (1001), the page reconnects by itself to the new process
            # and plays on.
            restarted = version(ana)
            connections = shown["snapshots"]
            stack.restart_table()
            ana.wait(f"p.snapshots > {connections}")
            page.locator("#conn[data-state=open]").wait_for()
            ana.wait(f"p.version >= {restarted}")
        result = act(ana, drag=(done["discard"] + done["drag"]) % 2 == 1)
        done[result] += 1
        if result == "wait":
            time.sleep(0.05)
    else:
        pytest.fail(f"the match did not end in time: {dict(done)}")

    # The match-end board: the winner, the whole tally (R9.2), and a rematch offered.
    result = ana.view()["match"]["result"]
    assert result["reason"] == "target"
    assert ana.shown("result") == "target"
    board = page.locator("#board .match-board")
    for title in ("Pontos", "Mãos ganhas", "Bônus da partida", "Bônus de mão", "Total"):
        assert board.get_by_text(title, exact=True).is_visible()
    totals = board.locator("tr.total td").all_inner_texts()
    assert totals == [str(result["tally"][0]["total"]), str(result["tally"][1]["total"])]
    assert page.locator("#board [data-action=rematch]").is_visible()
    assert restarted, "the table service was not restarted mid-match"
    assert done["draw"] > 0, done
    if done["discard"] + done["drag"] >= 2:  # discarding alternates a double click and a drag
        assert done["discard"] > 0, done
        assert done["drag"] > 0, done

    # Rematch at the same table: TITO always agrees (R9.4).
    page.locator("#board [data-action=rematch]").click()
    ana.wait(f"p.status === 'playing' && p.match === {played + 1}")
    assert ana.shown("table") == table
    ana.shot("06-revanche")

    # The stock's count turns red at 4 (R8.3): the page opened again, every view it is given
    # (its read, its socket's frames) rewritten to a stock of 4.
    count = page.locator("#stock-count")
    assert "low" not in (count.get_attribute("class") or "")
    shown_at_four(ana, table)
    assert count.inner_text() == "4"
    assert count.evaluate("c => getComputedStyle(c).backgroundColor") == "rgb(200, 16, 46)"
    page.locator("#stock").screenshot(path=str(SHOTS / "07-monte-com-4.png"))


def to_anas_turn(ana: Person) -> None:
    """Wait for Ana's turn in a match under way. A match TITO wins before Ana has played (he
    takes the upcard and goes gin at once: 47 points, past the target of 30, in one run of
    some twenty) is played again: REVANCHE, which TITO always accepts."""
    page = ana.page
    for _ in range(5):
        ana.wait(f"({MY_TURN}) || p.status === 'match_over'")
        shown = ana.shown()
        if shown["status"] != "match_over":
            return
        while page.locator("#board .hand-board").is_visible():
            page.locator("#board [data-action=close-board]").click()
        # The match-end board offers it; after a reload (no board for the past) the table does.
        where = "#board" if board_open(ana) else "#actions"
        page.locator(f"{where} [data-action=rematch]").click()
        ana.wait(f"p.status === 'playing' && p.match === {shown['match'] + 1}")
    raise AssertionError(f"Ana never had a turn in five matches: {ana.seen()}")


def shown_at_four(person: Person, table: str) -> None:
    """Reload ``person``'s page with every view it reads or is sent saying 4 cards in stock."""

    def four(text: str) -> str:
        return re.sub(r'"stock_count":\s*\d+', '"stock_count":4', text)

    def read(route: Any) -> None:
        answer = route.fetch()
        route.fulfill(response=answer, body=four(answer.text()))

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()
        server.on_message(lambda m: ws.send(four(m if isinstance(m, str) else m.decode())))

    person.page.route(lambda url: url.endswith(f"/v1/tables/{table}"), read)
    person.context.route_web_socket(SOCKET, relay)
    person.page.reload()
    person.page.locator("#conn[data-state=open]").wait_for()
    person.page.wait_for_function(
        "() => document.getElementById('stock-count').textContent === '4'"
    )
