"""A scripted person's move, for tests that play a match against a bot through the API."""

from __future__ import annotations

from typing import Any


def sobra_move(view: dict[str, Any]) -> dict[str, Any]:
    """From a seat's view: any knock, else the SOBRA's discard, else pass the upcard or draw
    from the stock (the moves a person scripted this way makes; never resign or leave)."""
    legal = view["legal"]
    knocks = [m for m in legal if m["type"] in ("knock", "big_gin")]
    if knocks:
        return dict(knocks[0])
    hint = view["hand"]["my_arrangement"].get("discard")
    if hint:
        return {"type": "discard", "card": hint}
    move = next(m for m in legal if m["type"] in ("pass_upcard", "draw", "discard"))
    return {"type": "draw", "source": "stock"} if move["type"] == "draw" else dict(move)
