"""What one seat, or a spectator, may see of a game (docs/RULES.md section 11), and ``legal``.

Built only from the state, and only from the parts the viewer may know: a seat sees its own
cards, a spectator none; both see the discard pile, counts, and the cards each seat took from
the discard pile and still holds. The stock order and the other hand never leave the state.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec.structs import replace

from shared.contracts import commands as c
from shared.contracts.events import Player
from shared.contracts.options import TableOptions
from shared.contracts.views import ArrangementView, HandView, MatchView, TableStatus, TableView
from shared.engine.cards import CARDS, TEXTS, cards_of
from shared.engine.game import absence_allowed
from shared.engine.hollywood import columns
from shared.engine.melds import (
    arrangement_of,
    best_discard,
    best_meld_masks,
    deadwood_points,
    kept_arrangement,
    knock_options,
)
from shared.engine.scoring import texts
from shared.engine.state import NO_CARD, GameState, HandState, Timing

# Commands are frozen values: one of each serves every view.
DISCARDS: tuple[c.Discard, ...] = tuple(c.Discard(card=text) for text in TEXTS)
UPCARD_CHOICES: tuple[c.Command, ...] = (c.TakeUpcard(), c.PassUpcard())
FROM_STOCK = c.Draw(source="stock")
FROM_DISCARD = c.Draw(source="discard")
QUIT: tuple[c.Command, ...] = (c.Resign(), c.Leave())
AFTER_MATCH: tuple[c.Command, ...] = (c.Rematch(), c.DeclineRematch(), c.Leave())


def legal(state: GameState, seat: int, timing: Timing) -> list[c.Command]:
    """Every command ``seat`` may send now, each complete; none for a spectator."""
    if seat not in (0, 1) or state.status in ("closed", "expired"):
        return []
    if state.status == "match_over":
        return list(AFTER_MATCH[1:] if state.rematch_offers[seat] else AFTER_MATCH)
    hand = state.hand
    if hand is None:
        return []
    if hand.to_act != seat:
        claim: list[c.Command] = [c.ClaimAbsence()] if absence_allowed(state, seat, timing) else []
        return [*claim, *QUIT]
    return [*_moves(state, hand, seat), *QUIT]


def _moves(state: GameState, hand: HandState, seat: int) -> list[c.Command]:
    if hand.phase == "upcard":
        return list(UPCARD_CHOICES)
    if hand.phase == "draw":
        if not hand.stock_only and hand.discard_pile:
            return [FROM_STOCK, FROM_DISCARD]
        return [FROM_STOCK]
    mask = hand.hands[seat]
    forbidden = 0 if hand.taken == NO_CARD else 1 << hand.taken
    out: list[c.Command] = [DISCARDS[card] for card in cards_of(mask & ~forbidden)]
    out += [
        c.Knock(card=TEXTS[card], deadwood=dead)
        for card, dead in knock_options(mask, forbidden, hand.knock_limit)
    ]
    if state.options.big_gin and deadwood_points(mask) == 0:
        out.append(c.BigGin())
    return out


def my_arrangement(hand: HandState, seat: int) -> ArrangementView:
    """The SOBRA of a seat's cards (R2.5): with 11, the best 10 and the discard that keeps them."""
    mask = hand.hands[seat]
    if mask.bit_count() <= 10:
        arrangement = arrangement_of(mask, best_meld_masks(mask))
        discard = None
    else:
        forbidden = 0 if hand.taken == NO_CARD else 1 << hand.taken
        card, _ = best_discard(mask, forbidden)
        arrangement = kept_arrangement(mask, card)
        discard = str(card)
    return ArrangementView(
        melds=[texts(m) for m in arrangement.melds],
        deadwood=texts(arrangement.deadwood),
        points=arrangement.points,
        discard=discard,
    )


def hand_view(hand: HandState, seat: int | None) -> HandView:
    """The hand as ``seat`` sees it (None: a spectator)."""
    counts = [hand.hands[0].bit_count(), hand.hands[1].bit_count()]
    known = [texts(cards_of(hand.known[0])), texts(cards_of(hand.known[1]))]
    public = HandView(
        number=hand.number,
        phase=hand.phase,
        to_act=hand.to_act,
        dealer=hand.dealer,
        knock_limit=hand.knock_limit,
        stock_count=hand.stock_count,
        discard_pile=[str(CARDS[x]) for x in hand.discard_pile],
        stock_only=hand.stock_only,
        card_counts=counts,
        known=known,
        discarded_by=list(hand.discarded_by),
        passed=[texts(cards_of(hand.passed[0])), texts(cards_of(hand.passed[1]))],
    )
    if seat is None:
        return public
    return replace(
        public,
        opponent_card_count=counts[1 - seat],
        opponent_known=known[1 - seat],
        my_cards=texts(cards_of(hand.hands[seat])),
        my_arrangement=my_arrangement(hand, seat),
    )


def match_view(state: GameState) -> MatchView:
    """The match's public part: scores, hands won, dealer, last hand record, result, and at a
    Hollywood table the three games' columns (R9.11)."""
    return MatchView(
        number=state.match,
        scores=list(state.scores),
        hands_won=list(state.hands_won),
        dealer=state.hand.dealer if state.hand is not None else None,
        rematch_offers=[s for s in (0, 1) if state.rematch_offers[s]],
        last_hand=state.last_hand,
        result=state.result,
        games=columns(state.options, state.games, final=state.result is not None)
        if state.games
        else None,
    )


def view(state: GameState, seat: int | None) -> tuple[MatchView, HandView | None]:
    """The match and the hand as ``seat`` (None: a spectator) may see them."""
    hand = state.hand
    return match_view(state), None if hand is None else hand_view(hand, seat)


def seat_table_view(
    state: GameState | None,
    seat: int | None,
    timing: Timing,
    *,
    table_id: str,
    version: int,
    status: TableStatus,
    seats: Sequence[Player | None],
    options: TableOptions,
    deck_design: str | None = None,
) -> TableView:
    """The whole view of a table for a seat (None: a spectator), ``legal`` included.

    The table service sends it to people and bots alike (R11.4); simulations build the same.
    """
    match = hand = None
    moves: list[c.Command] = []
    if state is not None:
        match, hand = view(state, seat)
        if seat is not None:
            moves = legal(state, seat, timing)
    elif seat == 0 and status == "waiting":
        moves = [c.Leave()]  # the creator may close a table nobody joined (R10.1)
    return TableView(
        table_id=table_id,
        version=version,
        status=status,
        you=seat,
        seats=list(seats),
        options=options,
        deck_design=deck_design,
        match=match,
        hand=hand,
        legal=moves,  # type: ignore[arg-type]
    )
