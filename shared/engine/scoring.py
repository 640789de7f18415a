"""Scoring a hand's end and a match's final tally (docs/RULES.md R7.5 to R7.9, R9.1, R9.2)."""

from __future__ import annotations

import msgspec

from shared.contracts.events import (
    GameColumn,
    HandEnded,
    HandEnding,
    LaidOff,
    SeatHand,
    SeatTally,
)
from shared.contracts.options import TableOptions
from shared.engine.cards import CARDS, TEXTS, cards_of, points_of
from shared.engine.layoffs import best_layoffs
from shared.engine.melds import arrangement_of, best_meld_masks
from shared.engine.state import HandState


class HandScore(msgspec.Struct, frozen=True):
    """How a knock, gin or big gin came out: who won and how many points."""

    how: HandEnding
    winner: int
    points: int
    seats: tuple[SeatHand, SeatHand]
    layoffs: tuple[LaidOff, ...]


def texts(cards: tuple[int, ...] | list[int]) -> list[str]:
    """Canonical text of cards."""
    return [TEXTS[c] for c in cards]


def seat_hand(seat: int, mask: int, melds: list[int]) -> SeatHand:
    """A seat's cards laid out with the given meld masks."""
    arrangement = arrangement_of(mask, melds)
    return SeatHand(
        seat=seat,
        cards=texts(cards_of(mask)),
        melds=[texts(m) for m in arrangement.melds],
        deadwood=texts(arrangement.deadwood),
        points=arrangement.points,
    )


def best_seat_hand(seat: int, mask: int) -> SeatHand:
    """A seat's cards in their best arrangement."""
    return seat_hand(seat, mask, best_meld_masks(mask))


def score_knock(
    options: TableOptions, knocker: int, kept: int, melds: list[int], defender_mask: int, big: bool
) -> HandScore:
    """Score a knock, gin or big gin whose knocker keeps ``kept`` laid out as ``melds``."""
    defender = 1 - knocker
    melds = sorted(melds, key=cards_of)  # the order the record shows: layoffs index into it
    knocker_dead = points_of(kept & ~sum(melds))
    knocker_hand = seat_hand(knocker, kept, melds)
    if knocker_dead == 0:  # gin or big gin: no layoffs (R7.3)
        defender_hand = best_seat_hand(defender, defender_mask)
        bonus = options.big_gin_bonus if big else options.gin_bonus
        return HandScore(
            how="big_gin" if big else "gin",
            winner=knocker,
            points=bonus + defender_hand.points,
            seats=_by_seat(knocker_hand, defender_hand),
            layoffs=(),
        )
    result = best_layoffs((cards_of(m) for m in melds), cards_of(defender_mask))
    laid = 0
    for card, _ in result.laid_off:
        laid |= 1 << card
    defender_hand = SeatHand(
        seat=defender,
        cards=texts(cards_of(defender_mask)),
        melds=[texts(m) for m in result.melds],
        deadwood=texts(result.deadwood),
        points=result.points,
    )
    layoffs = tuple(
        LaidOff(card=str(card), meld=index, by=defender) for card, index in result.laid_off
    )
    seats = _by_seat(knocker_hand, defender_hand)
    if knocker_dead < result.points:
        return HandScore("knock", knocker, result.points - knocker_dead, seats, layoffs)
    points = knocker_dead - result.points + options.undercut_bonus
    return HandScore("undercut", defender, points, seats, layoffs)


def _by_seat(a: SeatHand, b: SeatHand) -> tuple[SeatHand, SeatHand]:
    return (a, b) if a.seat == 0 else (b, a)


def revealed_hands(hand: HandState) -> list[SeatHand]:
    """Both seats' cards in their best arrangements, for a hand that ended without a knock."""
    return [best_seat_hand(seat, hand.hands[seat]) for seat in (0, 1)]


def hand_record(
    match: int,
    hand: HandState,
    scores: tuple[int, int],
    hands_won: tuple[int, int],
    how: HandEnding,
    winner: int | None = None,
    points: int = 0,
    seats: list[SeatHand] | None = None,
    layoffs: tuple[LaidOff, ...] = (),
    knocker: int | None = None,
    knock_discard: int | None = None,
    auto_discard: bool = False,
    games: list[GameColumn] | None = None,
    scored_in: list[int] | None = None,
) -> HandEnded:
    """The end-of-hand record (R7.4): both hands, layoffs, points, totals, deck and salt."""
    return HandEnded(
        match=match,
        hand=hand.number,
        how=how,
        winner=winner,
        points=points,
        knocker=knocker,
        knock_discard=None if knock_discard is None else str(CARDS[knock_discard]),
        knock_discard_chosen_by_server=auto_discard,
        seats=seats if seats is not None else revealed_hands(hand),
        layoffs=list(layoffs),
        scores=list(scores),
        hands_won=list(hands_won),
        deck=texts(hand.deck),
        salt=hand.salt,
        scored_in=scored_in,
        games=games,
    )


def tally(
    options: TableOptions,
    scores: tuple[int, int],
    hands_won: tuple[int, int],
    winner: int | None,
    bonuses: bool,
) -> list[SeatTally]:
    """The final tally of both seats (R9.2); without bonuses for a match that did not finish."""
    out = []
    for seat in (0, 1):
        game = 0
        box = 0
        if bonuses:
            box = options.box_bonus * hands_won[seat]
            if seat == winner:
                shutout = scores[1 - seat] == 0
                game = options.shutout_bonus if shutout else options.game_bonus
        out.append(
            SeatTally(
                points=scores[seat],
                hands_won=hands_won[seat],
                game_bonus=game,
                box_bonus=box,
                total=scores[seat] + game + box,
            )
        )
    return out
