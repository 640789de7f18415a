"""The chat's rules as pure functions: what a message may say, and how often one may be sent.

Text: trimmed (leading and trailing whitespace), then 1 to ``MAX_CHARS`` characters (code
points) with no control character at all (Unicode category Cc: newlines and tabs too, so a
message is one line and a client renders it as it renders a name). The text is stored as
written; clients escape it when they display it.

Rate: at most ``RATE_COUNT`` messages per ``RATE_WINDOW_S`` seconds per player, at all their
tables together.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta

MAX_CHARS = 500
RATE_COUNT = 5
RATE_WINDOW_S = 10.0
RATE_WINDOW = timedelta(seconds=RATE_WINDOW_S)
# Unicode category Cc is exactly C0, DEL and C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


class InvalidText(ValueError):
    """Text a message may not have; the message says why."""


def clean_text(raw: str) -> str:
    """The text to store: ``raw`` trimmed, or InvalidText.

    >>> clean_text("  oi, bom jogo!  ")
    'oi, bom jogo!'
    >>> clean_text("one\\ntwo")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    InvalidText: a message has no control character (U+000A at 3)
    """
    text = raw.strip()
    if not text:
        raise InvalidText("a message has at least one character besides spaces")
    if len(text) > MAX_CHARS:
        raise InvalidText(f"a message has at most {MAX_CHARS} characters, not {len(text)}")
    control = _CONTROL.search(text)
    if control is not None:
        raise InvalidText(
            f"a message has no control character (U+{ord(control.group()):04X}"
            f" at {control.start()})"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: not text
        raise InvalidText("a message is valid Unicode text") from exc
    return text


def retry_after_s(recent: Sequence[datetime], now: datetime) -> int | None:
    """Whole seconds to wait before the next message, or None if it may go now.

    ``recent`` holds the player's messages' times within the window before ``now``, newest
    first (at most ``RATE_COUNT`` are needed). The oldest of the last ``RATE_COUNT`` leaves the
    window ``RATE_WINDOW`` after it was posted.
    """
    if len(recent) < RATE_COUNT:
        return None
    frees_at = recent[RATE_COUNT - 1] + RATE_WINDOW
    return max(1, math.ceil((frees_at - now).total_seconds()))
