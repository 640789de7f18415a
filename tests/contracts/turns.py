"""A real bot turn built with the engine, as the table service builds one (no services)."""

from __future__ import annotations

from shared.contracts import commands as c
from shared.contracts.api import BotTurn
from shared.contracts.events import Player
from shared.contracts.options import TableOptions
from shared.engine import Timing, apply, deal, new_game, seat_table_view


def bot_turn_to_discard() -> BotTurn:
    """A turn of a bot that took the upcard and must discard (or knock)."""
    t = Timing(now=0.0)
    options = TableOptions()
    state, _ = new_game(options, t)
    state, _ = deal(state, deck=range(52), salt="00", lot=0, timing=t)
    assert state.hand is not None
    seat = state.hand.to_act
    state, _ = apply(state, seat, c.TakeUpcard(), t)
    view = seat_table_view(
        state,
        seat,
        t,
        table_id="t1",
        version=3,
        status="playing",
        seats=[Player(name="Ana", id="ana"), Player(name="TITO", bot="tito")],
        options=options,
    )
    return BotTurn(table_id="t1", seat=seat, level="tito", version=3, view=view)
