"""What a seat knows, read back from its view into card ints once (shared by the strategies).

A strategy sees only its ``TableView``. This module turns the view's card texts into ints and
masks (``shared.engine.cards``), works out what the seat has not seen (the opponent's hidden
cards and the stock), and finds the commands of ``view.legal`` a strategy picks from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.contracts import commands as c
from shared.contracts.views import HandView, TableView
from shared.engine.cards import BY_TEXT, FULL_DECK_MASK, TEXTS
from shared.engine.limits import knock_limit
from shared.engine.melds import deadwood_points

DEALT = 20  # ten cards each, one at a time (R3.1); the upcard is the next one
STOCK_AT_DEAL = 31  # 52 cards - 20 dealt - the upcard


class NoDecision(Exception):
    """The view offers the seat nothing to decide (not its turn, or a rematch already offered)."""


def card_of(text: str) -> int:
    """The int of a card's canonical text (views always write cards canonically)."""
    return int(BY_TEXT[text])


def mask_of_texts(texts: Iterable[str]) -> int:
    """The mask of some cards given as texts."""
    mask = 0
    for text in texts:
        mask |= 1 << BY_TEXT[text]
    return mask


@dataclass(frozen=True, slots=True)
class Knowledge:
    """One seat's knowledge of the hand on, as ints and masks."""

    seat: int
    phase: str
    hand: int  # my cards
    pile: tuple[int, ...]  # the discard pile, bottom first
    discarded_by: tuple[int, ...]  # who discarded each pile card (-1: the upcard)
    opp_known: int  # cards the opponent took from the pile and still holds
    opp_passed: int  # pile tops the opponent declined
    opp_discards: int  # pile cards the opponent discarded
    unseen: int  # the opponent's hidden cards and the stock
    opp_hidden: int  # how many of the opponent's cards are hidden
    stock_count: int
    knock_limit: int
    scores: tuple[int, int]  # mine, the opponent's
    target: int

    @property
    def top(self) -> int | None:
        """The top of the discard pile, if any."""
        return self.pile[-1] if self.pile else None

    @property
    def opp_last_discard(self) -> int | None:
        """The card the opponent threw at the end of its last turn, when it tops the pile."""
        if self.pile and self.discarded_by and self.discarded_by[-1] == 1 - self.seat:
            return self.pile[-1]
        return None

    @property
    def opp_stock_draws(self) -> int:
        """About how many cards the opponent has drawn unseen from the stock."""
        return (STOCK_AT_DEAL - self.stock_count) // 2


def read(view: TableView) -> Knowledge:
    """The seat's knowledge of the hand on; NoDecision when there is no hand or no seat."""
    hand = view.hand
    if hand is None or view.you is None or hand.my_cards is None:
        raise NoDecision("no hand in progress for this seat")
    seat = view.you
    mine = mask_of_texts(hand.my_cards)
    pile = tuple(card_of(t) for t in hand.discard_pile)
    by = tuple(hand.discarded_by) if hand.discarded_by else (-1,) * len(pile)
    opp = 1 - seat
    opp_known = mask_of_texts(hand.known[opp])
    pile_mask = mask_of_texts(hand.discard_pile)
    opp_discards = 0
    for card, who in zip(pile, by, strict=False):
        if who == opp:
            opp_discards |= 1 << card
    unseen = FULL_DECK_MASK & ~mine & ~pile_mask & ~opp_known
    return Knowledge(
        seat=seat,
        phase=hand.phase,
        hand=mine,
        pile=pile,
        discarded_by=by,
        opp_known=opp_known,
        opp_passed=mask_of_texts(hand.passed[opp]) if hand.passed else 0,
        opp_discards=opp_discards,
        unseen=unseen,
        opp_hidden=hand.card_counts[opp] - opp_known.bit_count(),
        stock_count=hand.stock_count,
        knock_limit=hand.knock_limit,
        scores=_scores(view, seat),
        target=view.options.target,
    )


def passed_up_a_knock(view: TableView, seat: int) -> bool:
    """Whether the last hand's record shows the opponent holding, when the seat ended the hand
    (or the stock ran out), ten cards it could have knocked with at its last discard.

    A player who knocks as soon as it can never shows such a hand; a patient one, playing for
    gin, often does. The record (R7.4) reveals both hands and the deck, so the hand's knock
    limit is the one its upcard set (R6.0); a hand still as dealt proves nothing (the opponent
    may not have discarded yet).
    """
    last = view.match.last_hand if view.match is not None else None
    if last is None or len(last.deck) != 52:
        return False
    ender = last.winner if last.how in ("gin", "big_gin") else last.knocker
    if ender is not None and ender != seat:
        return False  # the opponent ended it
    cards = next((s.cards for s in last.seats if s.seat == 1 - seat), None)
    if cards is None:
        return False
    deck = [card_of(text) for text in last.deck]
    held = mask_of_texts(cards)
    for first in (0, 1):  # the cards it was dealt, as non-dealer or as dealer (R3.1)
        if held == sum(1 << deck[i] for i in range(first, DEALT, 2)):
            return False
    return deadwood_points(held) <= knock_limit(view.options, deck[DEALT])


def _scores(view: TableView, seat: int) -> tuple[int, int]:
    """Mine and the opponent's; at a Hollywood table, in the first game still open (R9.10)."""
    if view.match is None:
        return (0, 0)
    scores = view.match.scores
    for game in view.match.games or ():
        if not game.closed:
            scores = game.scores
            break
    return (scores[seat], scores[1 - seat])


def my_turn(view: TableView) -> HandView:
    """The hand, when the seat has a move to make in it; NoDecision otherwise."""
    hand = view.hand
    if hand is None or view.you is None or hand.to_act != view.you:
        raise NoDecision("it is not this seat's turn")
    return hand


def rematch(view: TableView) -> c.Command:
    """After a match: the Rematch of ``legal``; NoDecision when it was already offered."""
    for move in view.legal:
        if isinstance(move, c.Rematch):
            return move
    raise NoDecision("no rematch to offer")


def match_over(view: TableView) -> bool:
    """Whether the match has ended (the only decision left is the rematch)."""
    return view.status == "match_over"


def find(view: TableView, kind: type[c.Command]) -> c.Command | None:
    """The first legal command of a kind, if any."""
    for move in view.legal:
        if isinstance(move, kind):
            return move
    return None


def draw_from(view: TableView, source: str) -> c.Command | None:
    """The legal draw from ``source`` ("stock" or "discard"), if any."""
    for move in view.legal:
        if isinstance(move, c.Draw) and move.source == source:
            return move
    return None


def pile_or_stock(view: TableView, wants: bool) -> c.Command:
    """The draw from the discard pile when ``wants`` and it is legal, else from the stock."""
    pile = draw_from(view, "discard")
    move = pile if wants and pile is not None else draw_from(view, "stock")
    if move is None:
        raise NoDecision("no draw is legal")
    return move


def discardable(view: TableView) -> int:
    """The mask of cards the seat may discard now (all but a card just taken from the pile)."""
    mask = 0
    for move in view.legal:
        if isinstance(move, c.Discard):
            mask |= 1 << BY_TEXT[move.card]
    return mask


def discard(view: TableView, card: int) -> c.Command:
    """The legal Discard of this card."""
    text = TEXTS[card]
    for move in view.legal:
        if isinstance(move, c.Discard) and move.card == text:
            return move
    raise ValueError(f"discarding {text} is not legal now")


def knocks(view: TableView) -> list[tuple[int, int, c.Knock]]:
    """Each legal knock as (card, deadwood it leaves, the command), lowest deadwood first."""
    out = []
    for move in view.legal:
        if isinstance(move, c.Knock) and move.card is not None:
            out.append((card_of(move.card), move.deadwood or 0, move))
    out.sort(key=lambda k: (k[1], k[0]))
    return out
