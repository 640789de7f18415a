"""A person's hands on the page: sign in, create a table, and play one decision at a time by
clicking what a person would click (the stock, a card twice, a card dragged, the buttons).
Everything is read from what the page shows (``Person.shown``), never from its variables."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests

from tests.web.conftest import Person, Stack

MY_TURN = "p.you !== null && p.phase !== null && p.to_act === p.you"


def sign_in(person: Person, name: str) -> None:
    """Fill the name form (the page mints a development token)."""
    form = person.page.locator("#name-form")
    form.wait_for(state="visible")
    form.locator("input[name=name]").fill(name)
    form.get_by_role("button", name="ENTRAR").click()
    person.wait(f"p.who === {name!r}")


def create_table(person: Person, **options: int) -> str:
    """Create a table from the lobby's form with these options; the table's id."""
    form = person.page.locator("#create-form")
    form.wait_for(state="visible")
    for name, value in options.items():
        form.locator(f"input[name={name}]").fill(str(value))
    form.get_by_role("button", name="CRIAR MESA").click()
    person.wait("p.status === 'waiting'")
    return str(person.shown("table"))


def board_open(person: Person) -> bool:
    return bool(person.page.locator("#board").is_visible())


def version(person: Person) -> int:
    return int(person.shown("version"))


def endings_follow_legal(person: Person, shown: dict[str, Any]) -> None:
    """BATER, GIN and BIG GIN show exactly when ``legal`` offers them (no card chosen: GIN when
    some discard leaves no deadwood, else BATER when some discard is within the limit); the
    offers are the server's, read by the API at the version the page shows."""
    view = person.view()
    if view["version"] != shown["version"]:
        return  # the table has moved on since (an absence's offer, say): nothing to compare
    knocks = [c["deadwood"] for c in view["legal"] if c["type"] == "knock"]
    present = {
        action: person.page.locator(f"#actions [data-action={action}]").count() > 0
        for action in ("knock", "gin", "big_gin")
    }
    assert present == {
        "knock": bool(knocks) and min(knocks) > 0,
        "gin": bool(knocks) and min(knocks) == 0,
        "big_gin": any(c["type"] == "big_gin" for c in view["legal"]),
    }, (present, view["legal"])


def act(person: Person, *, drag: bool = False, knock: bool = True) -> str:
    """Make the page's person take one decision if it is theirs; what was done.

    Passes the upcard; draws by clicking the stock; goes BIG GIN, GIN or BATER (without a chosen
    card: the server picks the discard) when the page shows it and ``knock``; otherwise
    discards ORGANIZAR's suggested card by clicking it twice (or dragging it to the pile).
    Each input is given once, as soon as the page shows the person's turn (a command of theirs
    may still be on its way: the page must keep the input, not drop it), and the page must act
    on it: the view moves on, or a board shows; else this fails with what the page showed.
    """
    shown: dict[str, Any] = person.shown()
    mine = shown["you"] is not None and shown["phase"] and shown["to_act"] == shown["you"]
    if shown["board"] or not mine:
        return "wait"
    before = shown["version"]
    done, give = _decision(person, shown, drag=drag, knock=knock)
    give()
    person.wait(f"p.version > {before} || p.board")
    return done


def _decision(
    person: Person, shown: dict[str, Any], *, drag: bool, knock: bool
) -> tuple[str, Callable[[], None]]:
    """What ``act`` does at what the page shows, and the clicks that do it."""
    page = person.page
    if shown["phase"] == "upcard":
        return "pass", page.locator("#actions [data-action=pass_upcard]").click
    if shown["phase"] == "draw":
        return "draw", page.locator("#stock").click
    endings_follow_legal(person, shown)
    ending = page.locator("#actions [data-action=big_gin], #actions [data-action=gin]")
    knocking = page.locator("#actions [data-action=knock]")
    if knock and ending.count():
        return "gin", ending.first.click
    if knock and knocking.count():
        return "knock", knocking.click
    card = shown["suggested"] or shown["cards"][0]
    target = page.locator(f"#hand .card[data-card='{card}']")
    if drag:
        return "drag", lambda: target.drag_to(page.locator("#discard"))

    def twice() -> None:  # the first click chooses the card (unless it is chosen already)
        if shown["selected"] != card:
            target.click()
        target.click()

    return "discard", twice


# --- Ana in her window against Bia (a token, no window) ------------------------------------


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


def waited_for(person: Person, condition: Callable[[], bool], within_s: float) -> float | None:
    """Seconds until ``condition()`` held, or None if it did not within ``within_s``. Waits in
    the page (not a sleep): a relay hears its sockets only while Playwright runs."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if condition():
            return time.monotonic() - started
        person.page.wait_for_timeout(50)
    return None


class Relay:
    """Stands between Ana's window and the table socket: ``drop()`` closes the socket under
    the page (it reconnects by itself; given a ``code``, as the server would close it); with
    ``hold``, the next snapshot is kept in ``held`` instead of reaching the page, until the
    test sends it; a frame ``lose`` says yes to never reaches the page (kept in ``lost``), as
    one the page's replica did not hear; ``snapshots`` are those the server sent."""

    def __init__(self) -> None:
        self.hold = False
        self.held: list[str] = []
        self.lose: Callable[[str], bool] = lambda text: False
        self.lost: list[str] = []
        self.snapshots: list[str] = []
        self.sockets: list[tuple[Any, Any]] = []

    def route(self, ws: Any) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            text = message if isinstance(message, str) else message.decode()
            if '"kind":"snapshot"' in text:
                self.snapshots.append(text)
            if self.hold and '"kind":"snapshot"' in text and not self.held:
                self.held.append(text)
                return
            if self.lose(text):
                self.lost.append(text)
                return
            ws.send(message)

        server.on_message(from_server)
        self.sockets.append((ws, server))

    def to_page(self, text: str) -> None:
        """Send the page a frame on its open socket, as the server would."""
        self.sockets[-1][0].send(text)

    def drop(self, code: int = 1011, reason: str = "the network is down") -> None:
        page_side, server_side = self.sockets[-1]
        page_side.close(code=code, reason=reason)
        server_side.close()
