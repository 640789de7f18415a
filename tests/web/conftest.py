"""The reference client (``web/``) in a real browser against the real services.

The table, chat, bots and timers services run as processes on this run's own database and
broker prefix, with development tokens on (so the table service serves the page). Debian's
Chromium (``/usr/bin/chromium``, which ``make test`` installs with apt-get when it is missing)
is driven headless by Playwright for Python (``GIN_CHROMIUM`` names another binary); without
it, or without the ``playwright`` package, the browser tests skip and say why, before any
service starts. Every screen a test shows is written as a PNG
under ``test-output/web/`` (git-ignored), to be looked at.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests

from shared.infra.settings import Settings
from tests.conftest import settings_of_their_own
from tests.e2e.processes import ROOT, Service, free_port, output_to

if TYPE_CHECKING:
    from tests.web.play import Relay

CHROMIUM = os.environ.get("GIN_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "test-output" / "web"
# The flags Debian's Chromium needs here: root (no sandbox), no GPU, and no calls home
# (a closed network refuses them, many at a time).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The table's WebSocket, for the tests that stand between a window and it.
SOCKET = re.compile(r"/v1/tables/[^/]+/ws")
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 860}
# Short enough that a test sees ENCERRAR POR AUSÊNCIA offered, long enough that nobody is
# absent while the tests play at their own pace.
ABSENCE_S = 6.0


@dataclass
class Stack:
    """The four services of the page's world; ``base`` is where the page is served."""

    base: str
    chat: str
    settings: Settings
    services: dict[str, Service] = field(default_factory=dict)

    def restart_table(self) -> None:
        """SIGTERM to the table service (its sockets close with 1001), then a new one on the
        same port: what a deploy does to a player mid-match."""
        old = self.services["table"]
        old.stop()
        with output_to(SHOTS / "services" / "table.log"):
            new = Service("services.table", self.settings, port=old.port)
        self.services["table"] = new
        # No asyncio.run here: a test calls this while Playwright's loop runs.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert new.proc.poll() is None, "the new table service exited"
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{new.base}/readyz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError("the new table service did not become ready")


@pytest.fixture(scope="session")
def web_settings(settings: Settings) -> Iterator[Settings]:
    """The run's settings with a database and a broker prefix of their own (these services
    live for the whole session: on the run's database their relay would publish the other
    tests' outbox rows), the table service on a port chosen first so that invitation links
    and the chat's development CORS name it."""
    port = free_port()
    with settings_of_their_own(
        settings,
        "web",
        http_port=port,
        public_url=f"http://127.0.0.1:{port}",
        absence_after_s=ABSENCE_S,
        turn_reminders_s="",  # the default offsets are past this short absence: none here
        bot_think_s=0.05,
    ) as own:
        yield own


@pytest.fixture(scope="session")
def stack(web_settings: Settings) -> Iterator[Stack]:
    """Table (serving the page), chat, bots and timers as processes, ready."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    logs = SHOTS / "services"
    logs.mkdir(exist_ok=True)
    services: dict[str, Service] = {}
    try:
        for name in ("table", "chat", "bots", "timers"):
            port = web_settings.http_port if name == "table" else None
            with output_to(logs / f"{name}.log"):
                services[name] = Service(f"services.{name}", web_settings, port=port)

        async def ready() -> None:
            await asyncio.gather(*(s.ready() for s in services.values()))

        asyncio.run(ready())
        yield Stack(
            base=services["table"].base,
            chat=services["chat"].base,
            settings=web_settings,
            services=services,
        )
    finally:
        for service in services.values():
            service.stop()


def _browser_missing() -> str | None:
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).is_file()):
        return (
            f"no Chromium at {CHROMIUM}: `make test` installs Debian's package `chromium` with "
            "apt-get; it could not here (no apt-get, no root, or no network)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: `make venv` installs the dev extras"
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, or a skip that says why there is none (before any service starts)."""
    missing = _browser_missing()
    if missing:
        pytest.skip(missing)
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium: str, stack: Stack) -> Iterator[Any]:
    """Headless Debian Chromium, driven by Playwright (never a downloaded browser).

    Per module, and after the services: Playwright's sync API runs an event loop of its own
    while it is open, and ``asyncio.run`` (the fixtures', the async tests') refuses to run
    inside one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


# What the page shows, read from its DOM: the attributes of ``#screen-table`` (the view's
# version, status, phase, whose turn), the connection's, the hand's cards, the piles, the
# board. Tests read these and what a person sees; never the page's own variables.
SHOWN = """() => {
  const t = document.getElementById("screen-table").dataset;
  const conn = document.getElementById("conn");
  const who = document.getElementById("who");
  const notice = document.getElementById("notice");
  const num = (x) => (x === undefined ? null : Number(x));
  const card = (selector) => {
    const found = document.querySelector(selector);
    return found ? found.dataset.card : null;
  };
  const design = [...document.body.classList].find((c) => c.startsWith("deck-"));
  return {
    table: t.table || null,
    version: num(t.version),
    status: t.status || null,
    you: num(t.you),
    match: num(t.match),
    result: t.result || null,
    phase: t.phase || null,
    to_act: num(t.toAct),
    stock_only: t.stockOnly === "true",
    busy: t.busy === "true",
    connection: conn.dataset.state || null,
    snapshots: Number(conn.dataset.snapshots || 0),
    who: who.hidden ? null : who.textContent,
    design: design ? design.slice(5) : null,
    board: !document.getElementById("board").hidden,
    cards: [...document.querySelectorAll("#hand .card[data-card]")].map((c) => c.dataset.card),
    selected: card("#hand .card.selected"),
    suggested: card("#hand .suggested .card[data-card]"),
    top: card("#discard-top .card[data-card]"),
    discards: num(document.getElementById("discard").dataset.count),
    notice: notice.hidden ? null : notice.textContent,
    log: [...document.querySelectorAll("#log li")].map((li) => li.textContent),
  };
}"""


class Person:
    """One browser context (one person's window) on the page, with its own storage."""

    def __init__(self, browser: Any, stack: Stack, viewport: dict[str, int], who: str) -> None:
        # A phone's screen has more pixels than CSS pixels: its screenshots are as sharp.
        scale = 2 if viewport["width"] < 700 else 1
        self.context = browser.new_context(
            viewport=viewport, device_scale_factor=scale, locale="pt-BR"
        )
        # The page finds the chat service here (it defaults to this host's port 8081).
        self.context.add_init_script(f"window.GIN_CONFIG = {{chatUrl: {stack.chat!r}}};")
        self.context.set_default_timeout(15_000)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"{who}: {exc}"))
        self.stack = stack
        self.who = who

    def shot(self, name: str) -> Path:
        """A screenshot of the whole page, for a person to look at."""
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def shown(self, key: str | None = None) -> Any:
        """What the page shows (``SHOWN``), or one entry of it."""
        shown = self.page.evaluate(SHOWN)
        return shown if key is None else shown[key]

    def wait(self, predicate: str, timeout_ms: float = 15_000) -> None:
        """Wait until ``predicate`` (JavaScript over ``p``, what the page shows: ``SHOWN``)
        holds; past the timeout, the failure says what the page showed."""
        from playwright.sync_api import TimeoutError as PageTimeout

        try:
            self.page.wait_for_function(
                f"() => {{ const p = ({SHOWN})(); return !!({predicate}); }}",
                timeout=timeout_ms,
            )
        except PageTimeout as timeout:
            raise AssertionError(f"{self.who}: never {predicate}; {self.seen()}") from timeout

    def seen(self) -> str:
        """What the page shows a person, for a failure's message."""
        shown = self.shown()
        shown.pop("cards")
        shown["log"] = shown["log"][-6:]
        return str(shown)

    def token(self) -> str:
        """The development token the page minted for its person (kept in its session)."""
        return str(self.page.evaluate("() => JSON.parse(sessionStorage.getItem('gin.me')).token"))

    def view(self) -> dict[str, Any]:
        """The table's view for this person, as the server gives it now (by the API)."""
        table = self.shown("table")
        answer = requests.get(
            f"{self.stack.base}/v1/tables/{table}",
            headers={"Authorization": f"Bearer {self.token()}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


@pytest.fixture
def people(browser: Any, stack: Stack) -> Iterator[Callable[..., Person]]:
    """``people(viewport, who)`` opens a fresh window; no page error may have happened."""
    opened: list[Person] = []

    def open_person(viewport: dict[str, int], who: str) -> Person:
        person = Person(browser, stack, viewport, who)
        opened.append(person)
        return person

    yield open_person
    errors = [e for p in opened for e in p.errors]
    for person in opened:
        person.context.close()
    assert not errors, errors


@pytest.fixture
def two(people: Any, stack: Stack) -> tuple[Person, str, str, Relay]:
    """Ana's window at a table she plays against Bia (a token, no window): Ana, table, Bia, and
    the relay of Ana's socket."""
    from tests.web.play import Relay, create_table, sign_in

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
