"""Two people play each other in two windows while a third, arrived late, watches: chat, a
socket cut mid-hand and recovered, absence, rematch and resignation."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from tests.web.conftest import ABSENCE_S, DESKTOP, PHONE, SOCKET, Person, Stack
from tests.web.play import act, create_table, sign_in

SUITS = {"c": "♣", "d": "♦", "h": "♥", "s": "♠"}


def label(card: str) -> str:
    """A card as the page writes it: ``Td`` is 10♦."""
    return ("10" if card[0] == "T" else card[0]) + SUITS[card[1]]


class Cutter:
    """Stands between a window and the table socket: ``cut()`` closes the socket under the page
    and refuses its reconnections until ``restore()``."""

    def __init__(self) -> None:
        self.down = False
        self.open: list[tuple[Any, Any]] = []
        self.refused = 0

    def route(self, ws: Any) -> None:
        if self.down:
            self.refused += 1
            ws.close(code=1011, reason="the network is down")
            return
        self.open.append((ws, ws.connect_to_server()))

    def cut(self) -> None:
        self.down = True
        for page_side, server_side in self.open:
            page_side.close(code=1011, reason="the network is down")
            server_side.close()
        self.open.clear()

    def restore(self) -> None:
        self.down = False


def chat(person: Person, text: str) -> None:
    form = person.page.locator("#chat-form")
    form.locator("input[name=text]").fill(text)
    form.get_by_role("button", name="ENVIAR").click()


def sees_chat(person: Person, line: str) -> None:
    person.page.locator("#chat-log li", has_text=line).wait_for()


def play_until(people: list[Person], done: Any, within_s: float = 60.0) -> None:
    """Both seats play (never ending the hand) until ``done()``."""
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, "the players did not get there in time"
        if all(act(p, knock=False) == "wait" for p in people):
            time.sleep(0.05)


@pytest.mark.timeout(240)
def test_two_windows_play_each_other_while_a_third_watches(people: Any, stack: Stack) -> None:
    ana: Person = people(DESKTOP, "ana")
    ana.page.goto(f"{stack.base}/")
    sign_in(ana, "Ana")
    table = create_table(ana)
    invite = ana.page.locator("#invite-link").input_value()

    # Bia opens the invitation in her own window (a phone), says her name and sits.
    bia: Person = people(PHONE, "bia")
    cutter = Cutter()
    bia.context.route_web_socket(SOCKET, cutter.route)
    bia.page.goto(invite)
    assert "convidado" in bia.page.locator("#name-why").inner_text()
    bia.shot("10-convite")
    sign_in(bia, "Bia")
    bia.wait("p.you === 1 && p.status === 'playing'")
    ana.wait("p.status === 'playing'")

    # Caio comes with the same link after both seats are taken: the server's refusal shows,
    # and he watches, with no hand shown and a chat box that says why he cannot write.
    caio: Person = people(DESKTOP, "caio")
    caio.page.goto(invite)
    sign_in(caio, "Caio")
    # The page shows the table before it asks for the seat: its socket opens after the answer.
    caio.wait("p.connection === 'open' && p.status === 'playing' && p.you === null")
    token = caio.token()
    expected = requests.post(
        f"{stack.base}/v1/tables/{table}/join",
        json={"invite_code": invite.rpartition("=")[2]},
        headers={"Authorization": f"Bearer {token}", "Accept-Language": "pt-BR"},
        timeout=10,
    ).json()["error"]  # the page asks for Portuguese, so it is told in Portuguese
    assert expected["code"] == "seat_taken"
    assert caio.page.locator("#notice").inner_text() == f"Recusado: {expected['message']}"
    assert caio.page.locator("#hand").count() == 0
    assert caio.page.locator("#seat-top .card.face:not(.known)").count() == 0
    assert caio.page.locator("#seat-bottom .card.face:not(.known)").count() == 0
    assert caio.page.locator("#chat-form input[name=text]").is_disabled()
    assert "quem assiste lê a conversa" in caio.page.locator("#chat-why").inner_text()

    # Duda has only the table's address and no name: she watches too.
    duda: Person = people(PHONE, "duda")
    duda.page.goto(f"{stack.base}/tables/{table}")
    duda.wait("p.status === 'playing' && p.you === null")
    assert duda.shown("who") is None
    assert duda.page.locator("#hand").count() == 0
    assert duda.page.locator("#chat-form input[name=text]").is_disabled()

    chat(ana, "Boa sorte, Bia!")
    for person in (bia, caio, duda):
        sees_chat(person, "Ana: Boa sorte, Bia!")
    chat(bia, "Obrigada!")
    sees_chat(ana, "Bia: Obrigada!")
    sees_chat(caio, "Bia: Obrigada!")

    def anas_draw() -> bool:
        shown = ana.shown()
        return bool(shown["discards"] >= 5 and shown["to_act"] == 0 and shown["phase"] == "draw")

    # Bia draws by clicking the discard pile: the card she took shows in her seat, to all.
    def bias_draw() -> bool:
        shown = bia.shown()
        return bool(shown["phase"] == "draw" and shown["to_act"] == 1 and not shown["stock_only"])

    play_until([ana, bia], bias_draw)
    taken = bia.shown("top")
    before = bia.shown("version")
    bia.page.locator("#discard").click()
    bia.wait(f"p.version > {before}")
    assert taken in bia.shown("cards")
    for person in (ana, caio):
        person.page.locator(f"#seat-top .card.known[data-card='{taken}']").wait_for()

    play_until([ana, bia], anas_draw)
    bia.wait(f"p.version === {ana.shown('version')}")
    ana.shot("11-dois-jogadores")
    bia.shot("12-dois-jogadores-celular")
    caio.shot("13-espectador")
    duda.shot("13-espectador-celular")

    # Bia's socket is cut mid-hand; Ana plays her turn and writes while Bia is away.
    cutter.cut()
    bia.page.locator("#conn[data-state=reconnecting]").wait_for()
    assert act(ana, knock=False) == "draw"
    assert act(ana, knock=False) in ("discard", "drag")
    missed = ana.shown("top")
    chat(ana, "Voltou?")
    time.sleep(0.5)
    assert bia.shown("version") < ana.shown("version")
    bia.shot("14-reconectando")
    assert cutter.refused or bia.page.locator("#conn").inner_text() == "reconectando…"

    # The page reconnects by itself and resumes from its last seq: the view, the events it
    # missed (in its log) and the chat.
    connections = bia.shown("snapshots")
    cutter.restore()
    bia.wait(f"p.snapshots > {connections}")
    bia.page.locator("#conn[data-state=open]").wait_for()
    bia.wait(f"p.version === {ana.shown('version')}")
    bia.page.locator("#log li", has_text=f"Ana descartou {label(missed)}.").wait_for()
    sees_chat(bia, "Ana: Voltou?")
    bia.shot("15-reconectado")
    assert act(bia, knock=False) == "draw"  # the page plays on

    # Bia stays away past the absence time: Ana is offered ENCERRAR POR AUSÊNCIA.
    claim = ana.page.locator("#actions [data-action=claim_absence]")
    claim.wait_for(timeout=(ABSENCE_S + 15) * 1000)
    ana.shot("16-ausencia")
    claim.click()
    ana.page.locator("#board .match-board").wait_for()
    assert "encerrou por ausência de Bia" in ana.page.locator("#board").inner_text()
    ana.shot("17-fim-por-ausencia")
    caio.page.locator("#board .match-board").wait_for()
    assert caio.page.locator("#board [data-action=rematch]").count() == 0
    caio.shot("18-espectador-fim")

    # A rematch at the same table: Ana offers, Bia accepts.
    ana.page.locator("#board [data-action=rematch]").click()
    bia.page.locator("#board .match-board").wait_for()
    accept = bia.page.locator("#board [data-action=rematch]")
    accept.filter(has_text="ACEITAR REVANCHE").wait_for()
    accept.click()
    for person in (ana, bia):
        person.wait("p.status === 'playing' && p.match === 2")

    # DESISTIR, confirmed: Ana wins the second match.
    bia.page.locator("#actions [data-action=resign]").click()
    bia.page.locator("#actions [data-action=resign-confirm]").click()
    ana.page.locator("#board .match-board").wait_for()
    ana.wait("p.status === 'match_over' && p.result === 'resigned'")
    assert "Bia desistiu: Ana venceu a partida." in ana.page.locator("#board").inner_text()
    ana.shot("19-desistencia")

    # Ana declines another: the table closes, and its chat is for reading only.
    ana.page.locator("#board [data-action=decline_rematch]").click()
    bia.wait("p.status === 'closed'")
    assert bia.page.locator("#chat-form input[name=text]").is_disabled()
    assert "fechada" in bia.page.locator("#chat-why").inner_text()
