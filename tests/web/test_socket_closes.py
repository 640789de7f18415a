"""How the page's table socket answers the server's closes (web/api.js, ``reconnectDelay``).

A replica that is full closes a new socket with 1013 ("reconnect in a few seconds"): the page
tries again after seconds, not at once. A table that was archived closes it with 4410: the
page says so and does not reconnect. The relay between Ana's window and the table socket
closes the page's side with the server's code.
"""

from __future__ import annotations

import pytest

from tests.web.conftest import Person
from tests.web.play import Relay, waited_for


def close_as_the_server(ana: Person, relay: Relay, code: int, reason: str) -> tuple[int, int]:
    """Close the page's open socket with ``code``; how many sockets it had opened by then, and
    how many snapshots it had shown."""
    ana.page.locator("#conn[data-state=open]").wait_for()
    opened, snapshots = len(relay.sockets), ana.shown("snapshots")
    relay.drop(code, reason)
    return opened, snapshots


def reconnected(ana: Person, relay: Relay, opened: int, within_s: float) -> float | None:
    """Seconds until the page opened another socket, or None within ``within_s``."""
    return waited_for(ana, lambda: len(relay.sockets) > opened, within_s)


@pytest.mark.timeout(120)
def test_an_archived_tables_socket_is_not_reconnected(
    two: tuple[Person, str, str, Relay],
) -> None:
    ana, _, _, relay = two
    opened, _ = close_as_the_server(ana, relay, 4410, "the table was archived")
    ana.page.locator("#conn[data-state=archived]").wait_for()
    assert ana.page.locator("#conn").text_content() == "mesa arquivada"
    # Any other close is tried again within 250 ms (the first wait); this one never is.
    assert reconnected(ana, relay, opened, within_s=2.0) is None
    ana.shot("socket-archived")


@pytest.mark.timeout(120)
def test_a_full_replicas_socket_is_tried_again_after_seconds(
    two: tuple[Person, str, str, Relay],
) -> None:
    ana, _, _, relay = two
    closed = close_as_the_server(ana, relay, 1013, "server full: reconnect in a few seconds")
    opened, snapshots = closed
    ana.page.locator("#conn[data-state=reconnecting]").wait_for()
    waited = reconnected(ana, relay, opened, within_s=10.0)
    assert waited is not None, "the page never tried again after 1013"
    assert waited >= 1.4, f"the page tried a full replica again after {waited:.2f} s"
    ana.wait(f"p.snapshots > {snapshots}")  # and it is open again, with a new snapshot
    ana.page.locator("#conn[data-state=open]").wait_for()
