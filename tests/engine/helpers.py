"""Small helpers for the rule tests: a rigged deck, a dealt game, a move, a refused move."""

from __future__ import annotations

import msgspec
import pytest

from shared.contracts import commands as c
from shared.contracts.events import AnyEvent
from shared.contracts.options import TableOptions
from shared.engine import (
    CARDS,
    GameState,
    IllegalAction,
    Timing,
    apply,
    deal,
    new_game,
    parse_card,
    parse_cards,
    to_act,
)

SALT = "test-salt"
TAKE = c.TakeUpcard()
PASS = c.PassUpcard()
STOCK = c.Draw(source="stock")
PILE = c.Draw(source="discard")


def rigged_deck(non_dealer: str, dealer: str, upcard: str, stock: str = "") -> list[int]:
    """A deck dealing these 10 + 10 cards (R3.1), this upcard, then the stock's top cards.

    The rest of the stock follows in card order (Ac 2c ... Ks), so the deck is deterministic.
    """
    first, second = parse_cards(non_dealer), parse_cards(dealer)
    chosen = [*first, *second, parse_card(upcard), *parse_cards(stock)]
    assert len(first) == len(second) == 10, (first, second)
    assert len(set(chosen)) == len(chosen), "a card is chosen twice"
    deck: list[int] = []
    for a, b in zip(first, second, strict=True):
        deck += [a, b]
    deck += chosen[20:]
    deck += [card for card in range(52) if card not in set(chosen)]
    return [int(card) for card in deck]


def start(
    deck: list[int], dealer: int = 0, options: TableOptions | None = None, now: float = 0.0
) -> GameState:
    """A new game whose first hand is dealt from ``deck``; ``dealer`` is the lot (R3.2)."""
    state, _ = new_game(options or TableOptions(), Timing(now=now))
    state, _ = deal(state, deck, SALT, dealer, Timing(now=now))
    return state


def deal_seats(
    state: GameState, seat0: str, seat1: str, upcard: str, stock: str = "", lot: int = 0
) -> tuple[GameState, list[AnyEvent]]:
    """Deal the next hand so that each seat gets the cards named for it, whoever deals."""
    dealer = lot if state.next_dealer is None else state.next_dealer
    by_seat = (seat0, seat1)
    deck = rigged_deck(by_seat[1 - dealer], by_seat[dealer], upcard, stock)
    return deal(state, deck, SALT, lot, Timing(now=0.0))


def play(
    state: GameState, command: c.Command, now: float = 0.0
) -> tuple[GameState, list[AnyEvent]]:
    """Apply ``command`` for the seat whose decision it is."""
    seat = to_act(state)
    assert seat is not None, "nobody is to act"
    return apply(state, seat, command, Timing(now=now))


def play_all(state: GameState, *commands: c.Command, now: float = 0.0) -> GameState:
    """Apply several commands in turn, each for the seat to act; the final state."""
    for command in commands:
        state, _ = play(state, command, now)
    return state


def refuse(
    state: GameState, seat: int, command: c.Command, code: str, now: float = 0.0
) -> IllegalAction:
    """Assert ``command`` is refused with ``code`` and the state held is exactly as before."""
    before = msgspec.json.decode(msgspec.json.encode(state), type=GameState)
    assert before == state
    with pytest.raises(IllegalAction) as info:
        apply(state, seat, command, Timing(now=now))
    assert info.value.code == code, info.value
    assert state == before
    return info.value


def texts(text: str) -> list[str]:
    """Canonical card texts of ``text``, in the order given."""
    return [str(card) for card in parse_cards(text)]


def sorted_texts(text: str) -> list[str]:
    """Canonical card texts of ``text`` in canonical order (suit, then rank), as records list."""
    return [str(card) for card in sorted(parse_cards(text))]


def knock(card: str | None = None, melds: list[str] | None = None) -> c.Knock:
    """A Knock command; ``melds`` as texts like ``"Ac 2c 3c"``."""
    sent = None if melds is None else [texts(m) for m in melds]
    return c.Knock(card=card, melds=sent)


def after_first_draw(
    seat0: str, seat1: str, drawn: str, options: TableOptions | None = None
) -> GameState:
    """Seat 1 deals; both pass the upcard; seat 0 draws ``drawn`` from the stock (11 cards)."""
    used = set(parse_cards(f"{seat0} {seat1} {drawn}"))
    upcard = next(x for x in parse_cards("Kd Ks Kh Kc Qs Qh Qc Js Jh") if x not in used)
    deck = rigged_deck(seat0, seat1, upcard=str(upcard), stock=drawn)
    return play_all(start(deck, dealer=1, options=options), PASS, PASS, STOCK)


def knock_by(
    state: GameState, seat: int, knocker: str, defender: str, lot: int = 0
) -> tuple[GameState, list[AnyEvent]]:
    """Deal a hand in which ``seat`` holds ``knocker`` and ends it on its first turn.

    Both pass the upcard; if ``seat`` deals, the non-dealer first draws and discards a stock
    card. ``seat`` then draws and knocks with the card drawn, so it keeps exactly ``knocker``.
    """
    dealer = lot if state.next_dealer is None else state.next_dealer
    used = set(parse_cards(f"{knocker} {defender}"))
    spare = [x for x in parse_cards("Kh Ks Qh Qc Jh Jd Th Ts Td 8c 7c 6c") if x not in used]
    upcard, first, second = (str(x) for x in spare[:3])
    hands = (knocker, defender) if seat == 0 else (defender, knocker)
    state, _ = deal_seats(state, *hands, upcard=upcard, stock=f"{first} {second}", lot=lot)
    state = play_all(state, PASS, PASS, STOCK)
    drawn = first
    if seat == dealer:
        state = play_all(state, c.Discard(card=first), STOCK)
        drawn = second
    return play(state, c.Knock(card=drawn))


def play_to_dead_hand(state: GameState) -> tuple[GameState, list[AnyEvent]]:
    """Both pass; each player draws from the stock and discards that card until the hand dies."""
    state = play_all(state, PASS, PASS)
    events: list[AnyEvent] = []
    while state.hand is not None:
        hand = state.hand
        drawn = hand.deck[len(hand.deck) - hand.stock_count]
        state = play_all(state, STOCK)
        state, events = play(state, c.Discard(card=str(CARDS[drawn])))
    return state, events
