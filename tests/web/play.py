"""A person's hands on the page: sign in, create a table, and play one decision at a time by
clicking what a person would click (the stock, a card twice, a card dragged, the buttons)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.web.conftest import Person

MY_TURN = "s.view && s.view.hand && s.view.you !== null && s.view.hand.to_act === s.view.you"


def sign_in(person: Person, name: str) -> None:
    """Fill the name form (the page mints a development token)."""
    form = person.page.locator("#name-form")
    form.wait_for(state="visible")
    form.locator("input[name=name]").fill(name)
    form.get_by_role("button", name="ENTRAR").click()
    person.wait("s.me !== null")


def create_table(person: Person, **options: int) -> str:
    """Create a table from the lobby's form with these options; the table's id."""
    form = person.page.locator("#create-form")
    form.wait_for(state="visible")
    for name, value in options.items():
        form.locator(f"input[name={name}]").fill(str(value))
    form.get_by_role("button", name="CRIAR MESA").click()
    person.wait("s.view && s.view.status === 'waiting'")
    return str(person.state(".table"))


def board_open(person: Person) -> bool:
    return bool(person.page.locator("#board").is_visible())


def version(person: Person) -> int:
    return int(person.state(".view.version"))


def endings_follow_legal(person: Person, view: dict[str, Any]) -> None:
    """BATER, GIN and BIG GIN show exactly when ``legal`` offers them (no card chosen: GIN when
    some discard leaves no deadwood, else BATER when some discard is within the limit)."""
    knocks = [c["deadwood"] for c in view["legal"] if c["type"] == "knock"]
    shown = {
        action: person.page.locator(f"#actions [data-action={action}]").count() > 0
        for action in ("knock", "gin", "big_gin")
    }
    assert shown == {
        "knock": bool(knocks) and min(knocks) > 0,
        "gin": bool(knocks) and min(knocks) == 0,
        "big_gin": any(c["type"] == "big_gin" for c in view["legal"]),
    }, (shown, view["legal"])


def act(person: Person, *, drag: bool = False, knock: bool = True) -> str:
    """Make the page's person take one decision if it is theirs; what was done.

    Passes the upcard; draws by clicking the stock; goes BIG GIN, GIN or BATER (without a chosen
    card: the server picks the discard) when the page shows it and ``knock``; otherwise
    discards ORGANIZAR's suggested card by clicking it twice (or dragging it to the pile).
    Waits until the view has moved on. An input the page never acted on (no command under
    way, no refusal shown: a click or a drop the browser lost while the page was drawn again)
    is given once more, as a person would, and counted in ``person.inputs_again``; anything
    else fails with what the page showed.
    """
    view: dict[str, Any] = person.state(".view")
    hand = view.get("hand")
    if board_open(person) or not hand or view["you"] is None or hand["to_act"] != view["you"]:
        return "wait"
    before = view["version"]
    done, give = _decision(person, view, drag=drag, knock=knock)
    moved_on = f"s.view.version > {before} || s.boards.length > 0"
    give()
    try:
        person.wait(moved_on, timeout_ms=7_500)
    except AssertionError:
        shown = person.page.locator("#notice")
        if person.state(".busy") or (shown.is_visible() and shown.text_content()):
            raise
        person.inputs_again.append(f"{done} at version {before}")
        give()
        person.wait(moved_on)
    return done


def _decision(
    person: Person, view: dict[str, Any], *, drag: bool, knock: bool
) -> tuple[str, Callable[[], None]]:
    """What ``act`` does at this view, and the clicks that do it."""
    page = person.page
    hand = view["hand"]
    if hand["phase"] == "upcard":
        return "pass", page.locator("#actions [data-action=pass_upcard]").click
    if hand["phase"] == "draw":
        return "draw", page.locator("#stock").click
    endings_follow_legal(person, view)
    ending = page.locator("#actions [data-action=big_gin], #actions [data-action=gin]")
    knocking = page.locator("#actions [data-action=knock]")
    if knock and ending.count():
        return "gin", ending.first.click
    if knock and knocking.count():
        return "knock", knocking.click
    card = hand["my_arrangement"].get("discard") or hand["my_cards"][0]
    target = page.locator(f"#hand .card[data-card='{card}']")
    if drag:
        return "drag", lambda: target.drag_to(page.locator("#discard"))

    def twice() -> None:  # the first click chooses the card (unless it is chosen already)
        if person.state(".selected") != card:
            target.click()
        target.click()

    return "discard", twice
