"""Chat the page's socket never carried is read back (DESIGN §7): the table socket's replica
did not hear a message (its broker channel was away, or the table bound late).

The relay between Ana's window and the table socket loses Bia's first message, as such a
replica would. The page reads it back when the next message comes past the gap, or when the
server sends a snapshot again; either way it shows both, in order.
"""

from __future__ import annotations

import pytest
import requests

from tests.web.conftest import Person, Stack
from tests.web.play import Relay, waited_for

FIRST, SECOND = "primeira mensagem", "segunda mensagem"


def bia_says(stack: Stack, table: str, bia: str, text: str) -> None:
    """Bia posts to the chat service, once it knows her seat (after the table's version)."""
    auth = {"Authorization": f"Bearer {bia}"}
    version = requests.get(f"{stack.base}/v1/tables/{table}", headers=auth, timeout=10).json()
    body = {"text": text, "after_version": version["version"]}
    posted = requests.post(
        f"{stack.chat}/v1/tables/{table}/messages", json=body, headers=auth, timeout=10
    )
    assert posted.status_code == 201, posted.text


def first_message_lost(two: tuple[Person, str, str, Relay], stack: Stack) -> None:
    """Bia says ``FIRST``; the server sends it to Ana's page and the relay loses it."""
    ana, table, bia, relay = two
    relay.lose = lambda frame: FIRST in frame and '"message_posted"' in frame
    bia_says(stack, table, bia, FIRST)
    lost = waited_for(ana, lambda: any(FIRST in frame for frame in relay.lost), 10.0)
    assert lost is not None, f"the server never sent {FIRST!r}"


def chat_lines(ana: Person) -> list[str]:
    return [line.strip() for line in ana.page.locator("#chat-log li").all_text_contents()]


def shows_in_order(ana: Person, *texts: str) -> None:
    for text in texts:
        ana.page.locator("#chat-log li", has_text=text).wait_for(timeout=10_000)
    lines = chat_lines(ana)
    at = [next(i for i, line in enumerate(lines) if text in line) for text in texts]
    assert at == sorted(at), lines


@pytest.mark.timeout(120)
def test_a_message_past_a_gap_brings_the_missed_one_back(
    two: tuple[Person, str, str, Relay], stack: Stack
) -> None:
    ana, table, bia, _ = two
    first_message_lost(two, stack)
    bia_says(stack, table, bia, SECOND)
    shows_in_order(ana, FIRST, SECOND)
    ana.shot("chat-gap-read-back")


@pytest.mark.timeout(120)
def test_a_snapshot_again_brings_the_missed_message_back(
    two: tuple[Person, str, str, Relay], stack: Stack
) -> None:
    ana, _, _, relay = two
    first_message_lost(two, stack)
    ana.page.wait_for_timeout(300)
    assert not any(FIRST in line for line in chat_lines(ana))
    relay.to_page(relay.snapshots[-1])  # as the server sends once its replica hears again
    shows_in_order(ana, FIRST)
