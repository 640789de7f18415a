"""The match as a state machine: deal, apply a command, and nothing else (docs/RULES.md 3 to 10).

``apply(state, seat, command, timing) -> (state, events)`` checks the command and either
raises ``IllegalAction`` (naming the rule) or returns the new state and the public events.
Chance is an input: when ``state.needs_deal`` the caller passes a shuffled deck, a salt and
a lot to ``deal``, so a hand is fully determined by its deck and its commands.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from msgspec.structs import replace

from shared.contracts import commands as c
from shared.contracts.events import (
    AnyEvent,
    CardDiscarded,
    CardDrawn,
    CloseReason,
    HandEnded,
    HandStarted,
    MatchEnded,
    MatchEnding,
    MatchStarted,
    RematchAccepted,
    RematchOffered,
    StockLow,
    TableClosed,
    TableExpired,
    UpcardPassed,
    UpcardTaken,
)
from shared.contracts.options import TableOptions
from shared.engine.cards import CARDS, cards_of, mask_of, parse_card, points_of
from shared.engine.errors import IllegalAction
from shared.engine.hollywood import columns, games_of, match_winner, score_hand, summed
from shared.engine.limits import knock_limit
from shared.engine.melds import (
    best_discard,
    best_meld_masks,
    deadwood_points,
    discard_order,
    is_meld,
)
from shared.engine.scoring import HandScore, hand_record, score_knock, tally
from shared.engine.state import (
    HAND_SIZE,
    NO_CARD,
    STOCK_START,
    GameState,
    HandState,
    Timing,
)

Events = list[AnyEvent]
Result = tuple[GameState, Events]
STOCK_LOW_AT = 4  # R8.3
DEAD_HAND_AT = 2  # R8.1


def new_game(options: TableOptions, timing: Timing) -> Result:
    """A game whose first match starts now; the caller deals next (R3.2: dealer by lot)."""
    state = GameState(
        options=options,
        games=games_of(options),
        decision_since=timing.now,
        last_move_at=timing.now,
    )
    return state, [MatchStarted(match=1, options=options)]


def deck_commitment(deck: Sequence[int], salt: str) -> str:
    """sha256 of the deck order and the salt: ``"Ac 2c ... Ks:<salt>"`` in UTF-8 (fair deals).

    >>> len(deck_commitment(range(52), "00"))
    64
    """
    text = " ".join(str(CARDS[card]) for card in deck) + ":" + salt
    return hashlib.sha256(text.encode()).hexdigest()


def deal(state: GameState, deck: Sequence[int], salt: str, lot: int, timing: Timing) -> Result:
    """Deal the next hand from a shuffled deck (R3.1); ``lot`` is the dealer if chosen by lot."""
    if not state.needs_deal:
        raise IllegalAction("no_deal_due", "no hand is waiting to be dealt", "R3.1")
    if sorted(deck) != list(range(52)):
        raise IllegalAction("bad_deck", "a deck is the 52 cards once each", "R1.1")
    if lot not in (0, 1):
        raise IllegalAction("bad_lot", "the lot names seat 0 or seat 1", "R3.2")
    dealer = lot if state.next_dealer is None else state.next_dealer
    first = 1 - dealer
    order = tuple(deck)
    hands = [0, 0]
    for i in range(2 * HAND_SIZE):  # one at a time, the non-dealer first
        hands[first if i % 2 == 0 else dealer] |= 1 << order[i]
    upcard = order[2 * HAND_SIZE]
    hand = HandState(
        number=state.hands_dealt + 1,
        dealer=dealer,
        reason=state.next_reason,
        deck=order,
        salt=salt,
        knock_limit=knock_limit(state.options, upcard),
        hands=(hands[0], hands[1]),
        known=(0, 0),
        discard_pile=(upcard,),
        to_act=first,
    )
    started = HandStarted(
        match=state.match,
        hand=hand.number,
        dealer=dealer,
        reason=hand.reason,
        upcard=str(CARDS[upcard]),
        stock_count=hand.stock_count,
        knock_limit=hand.knock_limit,
        deck_commitment=deck_commitment(order, salt),
    )
    new = replace(state, hand=hand, hands_dealt=hand.number, decision_since=timing.now)
    return new, [started]


def to_act(state: GameState) -> int | None:
    """The seat whose decision it is, or None when nobody's is (between hands, after a match)."""
    if state.status != "playing" or state.hand is None:
        return None
    return state.hand.to_act


# --- the checks every command goes through ------------------------------------------------


def _open(state: GameState) -> None:
    if state.status in ("closed", "expired"):
        raise IllegalAction("table_closed", "this table is closed", "R10.3")


def _hand_of(state: GameState, seat: int) -> HandState:
    _open(state)
    if state.status == "match_over":
        raise IllegalAction("match_over", "the match is over", "R9.1")
    if state.hand is None:
        raise IllegalAction("no_hand", "no hand is in progress", "R3.1")
    if state.hand.to_act != seat:
        raise IllegalAction("not_your_turn", "it is not your turn", "R5.4")
    return state.hand


def _in_phase(hand: HandState, phase: str, code: str, message: str, rule: str) -> None:
    if hand.phase != phase:
        raise IllegalAction(code, message, rule)


def _playing(state: GameState) -> None:
    _open(state)
    if state.status != "playing":
        raise IllegalAction("match_over", "the match is over", "R9.3")


def _card_in_hand(hand: HandState, seat: int, text: str) -> int:
    card = int(parse_card(text))  # plain ints in the state, which is stored as it is
    if not hand.hands[seat] >> card & 1:
        raise IllegalAction("card_not_in_hand", f"{card} is not in your hand", "R5.2")
    return card


def _not_taken(hand: HandState, card: int) -> None:
    if card == hand.taken:
        raise IllegalAction(
            "card_just_taken",
            f"{CARDS[card]} was just taken from the discard pile and cannot go back this turn",
            "R5.3",
        )


# --- the hand ---------------------------------------------------------------------------


def _take_upcard(state: GameState, seat: int, cmd: c.TakeUpcard, t: Timing) -> Result:
    hand = _hand_of(state, seat)
    _in_phase(hand, "upcard", "no_upcard_offer", "the upcard is no longer offered", "R4.1")
    card = hand.discard_pile[-1]
    hand = replace(
        hand,
        hands=_with(hand.hands, seat, hand.hands[seat] | 1 << card),
        known=_with(hand.known, seat, hand.known[seat] | 1 << card),
        discard_pile=hand.discard_pile[:-1],
        discarded_by=hand.discarded_by[:-1],
        phase="discard",
        taken=card,
    )
    return _moved(state, hand, t), [UpcardTaken(hand=hand.number, seat=seat, card=str(CARDS[card]))]


def _pass_upcard(state: GameState, seat: int, cmd: c.PassUpcard, t: Timing) -> Result:
    hand = _hand_of(state, seat)
    _in_phase(hand, "upcard", "no_upcard_offer", "the upcard is no longer offered", "R4.1")
    hand = replace(hand, passed=_declined(hand, seat))
    if hand.upcard_passes == 0:  # R4.2: the dealer decides next
        hand = replace(hand, upcard_passes=1, to_act=1 - seat)
        return _moved(state, hand, t), [UpcardPassed(hand=hand.number, seat=seat)]
    # R4.4: both passed; the non-dealer starts, from the stock only
    hand = replace(hand, upcard_passes=2, to_act=1 - seat, phase="draw", stock_only=True)
    event = UpcardPassed(hand=hand.number, seat=seat, reason="both_passed_upcard")
    return _moved(state, hand, t), [event]


def _draw(state: GameState, seat: int, cmd: c.Draw, t: Timing) -> Result:
    hand = _hand_of(state, seat)
    if hand.phase == "upcard":
        raise IllegalAction("upcard_pending", "take or pass the upcard first", "R4.1")
    _in_phase(hand, "draw", "already_drawn", "you have drawn already: now discard", "R5.1")
    events: Events = []
    if cmd.source == "stock":
        card = hand.deck[STOCK_START + hand.stock_drawn]
        hand = replace(
            hand,
            passed=_declined(hand, seat),
            hands=_with(hand.hands, seat, hand.hands[seat] | 1 << card),
            stock_drawn=hand.stock_drawn + 1,
            phase="discard",
            taken=NO_CARD,
            stock_only=False,
        )
        events.append(
            CardDrawn(hand=hand.number, seat=seat, source="stock", stock_count=hand.stock_count)
        )
        if hand.stock_count == STOCK_LOW_AT:
            events.append(StockLow(hand=hand.number, stock_count=hand.stock_count))
    else:
        if hand.stock_only:
            raise IllegalAction(
                "stock_only",
                "both passed the upcard: the first draw is from the stock",
                "R4.4",
            )
        if not hand.discard_pile:
            raise IllegalAction("discard_pile_empty", "the discard pile is empty", "R5.1")
        card = hand.discard_pile[-1]
        hand = replace(
            hand,
            hands=_with(hand.hands, seat, hand.hands[seat] | 1 << card),
            known=_with(hand.known, seat, hand.known[seat] | 1 << card),
            discard_pile=hand.discard_pile[:-1],
            discarded_by=hand.discarded_by[:-1],
            phase="discard",
            taken=card,
        )
        events.append(
            CardDrawn(
                hand=hand.number,
                seat=seat,
                source="discard",
                card=str(CARDS[card]),
                stock_count=hand.stock_count,
            )
        )
    return _moved(state, hand, t), events


def _must_discard(hand: HandState) -> None:
    if hand.phase == "upcard":
        raise IllegalAction("upcard_pending", "take or pass the upcard first", "R4.1")
    _in_phase(hand, "discard", "must_draw_first", "draw a card first", "R5.1")


def _discard(state: GameState, seat: int, cmd: c.Discard, t: Timing) -> Result:
    hand = _hand_of(state, seat)
    _must_discard(hand)
    card = _card_in_hand(hand, seat, cmd.card)
    _not_taken(hand, card)
    hand = replace(
        hand,
        hands=_with(hand.hands, seat, hand.hands[seat] & ~(1 << card)),
        known=_with(hand.known, seat, hand.known[seat] & ~(1 << card)),
        discard_pile=(*hand.discard_pile, card),
        discarded_by=(*hand.discarded_by, seat),
        phase="draw",
        to_act=1 - seat,
        taken=NO_CARD,
    )
    events: Events = [CardDiscarded(hand=hand.number, seat=seat, card=str(CARDS[card]))]
    if hand.stock_count <= DEAD_HAND_AT:  # R8.1: the hand is dead at this discard
        record = hand_record(
            state.match, hand, state.scores, state.hands_won, "dead_hand", **_unscored(state)
        )
        events.append(record)
        state = replace(
            state,
            hand=None,
            last_hand=record,
            next_dealer=hand.dealer,
            next_reason="dead_hand_redeal",
            last_move_at=t.now,
        )
        return state, events
    return _moved(state, hand, t), events


def _knock_discard(hand: HandState, seat: int, cmd: c.Knock, in_melds: int) -> tuple[int, bool]:
    """The knock discard: the one sent, or the one R6.5 picks. True when the server picked."""
    mask = hand.hands[seat]
    if cmd.card is not None:
        card = _card_in_hand(hand, seat, cmd.card)
        _not_taken(hand, card)
        return card, False
    forbidden = 0 if hand.taken == NO_CARD else 1 << hand.taken
    if cmd.melds is None:
        return int(best_discard(mask, forbidden)[0]), True
    # melds sent without a card: the discard is the R6.5-preferred card outside them
    free = cards_of(mask & ~in_melds & ~forbidden)
    if not free:
        raise IllegalAction("no_knock_discard", "every card is in the melds sent", "R6.1")
    return int(discard_order(free)[0]), True


def _sent_melds(hand: HandState, seat: int, melds: list[list[str]]) -> list[int]:
    out = []
    used = 0
    for meld in melds:
        cards = [_card_in_hand(hand, seat, text) for text in meld]
        if not is_meld(cards):
            raise IllegalAction(
                "invalid_meld",
                f"{' '.join(str(CARDS[x]) for x in cards)} is neither a set nor a run",
                "R2.1",
            )
        mask = mask_of(cards)
        if used & mask:
            raise IllegalAction("overlapping_melds", "a card is in two melds", "R2.3")
        used |= mask
        out.append(mask)
    return out


def _knock(state: GameState, seat: int, cmd: c.Knock, t: Timing) -> Result:
    hand = _hand_of(state, seat)
    _must_discard(hand)
    sent = _sent_melds(hand, seat, cmd.melds) if cmd.melds is not None else None
    in_melds = sum(sent) if sent else 0
    discard, auto = _knock_discard(hand, seat, cmd, in_melds)
    if in_melds >> discard & 1:
        raise IllegalAction("discard_in_meld", "the knock discard is in a meld sent", "R6.1")
    kept = hand.hands[seat] & ~(1 << discard)
    if deadwood_points(kept) == 0:  # gin whatever arrangement was sent (R6.4)
        melds = best_meld_masks(kept, held=hand.hands[seat])
    elif sent is not None:
        melds = sent
    else:
        melds = best_meld_masks(kept, held=hand.hands[seat])
    deadwood = points_of(kept & ~sum(melds))
    if deadwood > hand.knock_limit:
        raise IllegalAction(
            "knock_over_limit",
            f"discarding {CARDS[discard]} leaves {deadwood} points of deadwood; "
            f"the limit in this hand is {hand.knock_limit}",
            "R6.6",
        )
    score = score_knock(state.options, seat, kept, melds, hand.hands[1 - seat], big=False)
    return _hand_over(state, hand, score, t, seat, discard, auto)


def _big_gin(state: GameState, seat: int, cmd: c.BigGin, t: Timing) -> Result:
    hand = _hand_of(state, seat)
    _must_discard(hand)
    if not state.options.big_gin:
        raise IllegalAction(
            "big_gin_off", "big gin is off at this table: discard and go gin", "R6.3"
        )
    mask = hand.hands[seat]
    if deadwood_points(mask) != 0:
        raise IllegalAction("not_big_gin", "big gin needs all 11 cards in melds", "R6.3")
    score = score_knock(
        state.options, seat, mask, best_meld_masks(mask), hand.hands[1 - seat], True
    )
    return _hand_over(state, hand, score, t, seat, None, False)


def _hand_over(
    state: GameState,
    hand: HandState,
    score: HandScore,
    t: Timing,
    knocker: int,
    discard: int | None,
    auto: bool,
) -> Result:
    won = _with(state.hands_won, score.winner, state.hands_won[score.winner] + 1)
    target = state.options.target
    games, scored_in = score_hand(
        state.games, score.winner, won[score.winner], score.points, target
    )
    if state.games:  # Hollywood: the total is the three games' points (R9.7)
        scores = (sum(g.scores[0] for g in games), sum(g.scores[1] for g in games))
    else:
        scores = _with(state.scores, score.winner, state.scores[score.winner] + score.points)
    record = hand_record(
        state.match,
        hand,
        scores,
        won,
        score.how,
        winner=score.winner,
        points=score.points,
        seats=list(score.seats),
        layoffs=score.layoffs,
        knocker=knocker,
        knock_discard=discard,
        auto_discard=auto,
        games=columns(state.options, games) if games else None,
        scored_in=scored_in if games else None,
    )
    state = replace(
        state,
        hand=None,
        scores=scores,
        hands_won=won,
        games=games,
        last_hand=record,
        last_move_at=t.now,
    )
    if games and all(game.closed for game in games):  # R9.10: the third game closed
        return _match_over(state, match_winner(games), "target", None, [record], bonuses=True)
    if not games and scores[score.winner] >= target:  # R9.1
        return _match_over(state, score.winner, "target", None, [record], bonuses=True)
    dealer, reason = _next_dealer(state.options.dealer, hand.dealer, score.winner)
    return replace(state, next_dealer=dealer, next_reason=reason), [record]


def _unscored(state: GameState) -> dict[str, Any]:
    """A Hollywood record's columns for a hand that scored nothing (dead or abandoned)."""
    if not state.games:
        return {}
    return {"games": columns(state.options, state.games), "scored_in": []}


def _next_dealer(rule: str, dealer: int, winner: int) -> tuple[int, Any]:
    if rule == "loser":
        return 1 - winner, "lost_previous_hand"
    if rule == "alternate":
        return 1 - dealer, "alternate"
    return winner, "won_previous_hand"


def _match_over(
    state: GameState,
    winner: int | None,
    reason: MatchEnding,
    by: int | None,
    events: Events,
    bonuses: bool,
) -> Result:
    if state.games:  # Hollywood: closed games keep their bonuses, open ones get none (R9.12)
        tallies = summed(state.options, state.games)
        games = columns(state.options, state.games, final=True)
    else:
        tallies = tally(state.options, state.scores, state.hands_won, winner, bonuses)
        games = None
    ended = MatchEnded(
        match=state.match, winner=winner, reason=reason, by=by, tally=tallies, games=games
    )
    state = replace(
        state, status="match_over", hand=None, result=ended, rematch_offers=(False, False)
    )
    return state, [*events, ended]


# --- ending a match early, rematch, expiry ---------------------------------------------


def _abandon(state: GameState, winner: int | None, reason: MatchEnding, by: int | None) -> Result:
    """End the match mid-way: reveal the hand on, if any (R9.3), no bonuses."""
    events: Events = []
    if state.hand is not None:
        record = hand_record(
            state.match, state.hand, state.scores, state.hands_won, "abandoned", **_unscored(state)
        )
        events.append(record)
        state = replace(state, last_hand=record)
    return _match_over(state, winner, reason, by, events, bonuses=False)


def _resign(state: GameState, seat: int, cmd: c.Resign, t: Timing) -> Result:
    _playing(state)
    state, events = _abandon(state, 1 - seat, "resigned", seat)
    return replace(state, last_move_at=t.now), events


def _leave(state: GameState, seat: int, cmd: c.Leave, t: Timing) -> Result:
    _open(state)
    if state.status == "match_over":  # leaving after a match declines the rematch
        return _close(state, t, "left")
    state, events = _abandon(state, 1 - seat, "left", seat)
    return replace(state, last_move_at=t.now), events


def absence_allowed(state: GameState, seat: int, t: Timing) -> bool:
    """Whether ``seat`` may claim now that its opponent is absent (R10.2)."""
    return (
        state.status == "playing"
        and state.hand is not None
        and state.hand.to_act == 1 - seat
        and t.now - state.decision_since > t.absence_after
    )


def _claim_absence(state: GameState, seat: int, cmd: c.ClaimAbsence, t: Timing) -> Result:
    _playing(state)
    if state.hand is None or state.hand.to_act == seat:
        raise IllegalAction("not_absent", "the decision is yours, not your opponent's", "R10.2")
    if not absence_allowed(state, seat, t):
        waited = t.now - state.decision_since
        raise IllegalAction(
            "absence_too_early",
            f"your opponent has had the decision for {int(waited)} s; "
            f"a claim needs more than {int(t.absence_after)} s",
            "R10.2",
        )
    state, events = _abandon(state, seat, "absence", 1 - seat)
    return replace(state, last_move_at=t.now), events


def _rematch(state: GameState, seat: int, cmd: c.Rematch, t: Timing) -> Result:
    _open(state)
    if state.status != "match_over":
        raise IllegalAction("match_not_over", "a rematch follows a finished match", "R9.4")
    if state.rematch_offers[seat]:
        raise IllegalAction("rematch_already_offered", "you have offered a rematch", "R9.4")
    offers = _with(state.rematch_offers, seat, True)
    events: Events = [RematchOffered(match=state.match, seat=seat)]
    if not all(offers):
        return replace(state, rematch_offers=offers, last_move_at=t.now), events
    number = state.match + 1
    fresh = GameState(
        options=state.options,
        match=number,
        games=games_of(state.options),
        hands_dealt=state.hands_dealt,  # hand numbers run on across a table's matches
        decision_since=t.now,
        last_move_at=t.now,
    )
    events += [RematchAccepted(match=number), MatchStarted(match=number, options=state.options)]
    return fresh, events


def _decline_rematch(state: GameState, seat: int, cmd: c.DeclineRematch, t: Timing) -> Result:
    _open(state)
    if state.status != "match_over":
        raise IllegalAction("match_not_over", "a rematch follows a finished match", "R9.4")
    return _close(state, t, "rematch_declined")


def _close(state: GameState, t: Timing, reason: CloseReason) -> Result:
    closed = replace(state, status="closed", last_move_at=t.now)
    return closed, [TableClosed(reason=reason)]


def expiry_due(state: GameState, t: Timing) -> bool:
    """Whether no command has been accepted for the expiry time (R10.3)."""
    return t.now - state.last_move_at >= t.expiry_after


def expire(state: GameState, t: Timing) -> Result:
    """Expire an idle table (R10.3): a match on ends with no winner; the table closes."""
    _open(state)
    if not expiry_due(state, t):
        raise IllegalAction(
            "not_expired",
            f"the last accepted command was {int(t.now - state.last_move_at)} s ago",
            "R10.3",
        )
    events: Events = []
    if state.status == "playing":
        state, events = _abandon(state, None, "expired", None)
    return replace(state, status="expired"), [*events, TableExpired()]


# --- dispatch --------------------------------------------------------------------------

Handler = Callable[[GameState, int, Any, Timing], Result]
HANDLERS: dict[type[c.Command], Handler] = {
    c.TakeUpcard: _take_upcard,
    c.PassUpcard: _pass_upcard,
    c.Draw: _draw,
    c.Discard: _discard,
    c.Knock: _knock,
    c.BigGin: _big_gin,
    c.Resign: _resign,
    c.Leave: _leave,
    c.ClaimAbsence: _claim_absence,
    c.Rematch: _rematch,
    c.DeclineRematch: _decline_rematch,
}


def apply(state: GameState, seat: int, command: c.Command, timing: Timing) -> Result:
    """Check and apply one seat's command: the new state and its events, or IllegalAction."""
    if seat not in (0, 1):
        raise IllegalAction("not_seated", "only a seated player sends commands", "R10.1")
    handler = HANDLERS.get(type(command))
    if handler is None:
        raise IllegalAction(
            "unknown_command", f"{type(command).__name__} is not a seat's command", None
        )
    return handler(state, seat, command, timing)


def _moved(state: GameState, hand: HandState, t: Timing) -> GameState:
    """The state after a move in a hand: the decision clock restarts when the turn changes."""
    before = state.hand.to_act if state.hand is not None else None
    since = state.decision_since if before == hand.to_act else t.now
    return replace(state, hand=hand, last_move_at=t.now, decision_since=since)


def _declined(hand: HandState, seat: int) -> tuple[int, int]:
    """The seat's declined cards, with the discard pile's top it is passing on now."""
    if not hand.discard_pile:
        return hand.passed
    return _with(hand.passed, seat, hand.passed[seat] | 1 << hand.discard_pile[-1])


def _with(pair: tuple[int, int], seat: int, value: int) -> tuple[int, int]:
    return (value, pair[1]) if seat == 0 else (pair[0], value)


__all__ = [
    "HandEnded",
    "absence_allowed",
    "apply",
    "deal",
    "deck_commitment",
    "expire",
    "expiry_due",
    "knock_limit",
    "new_game",
    "to_act",
]
