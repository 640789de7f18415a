"""Hollywood gin: three games scored at once, in columns (docs/RULES.md R9.6 to R9.12).

A player's n-th won hand of the match goes into games 1 to n (all three from the third on),
but only into those still open; a game closes when a player's points in it reach the target.
The match is over when the third game closes, which is always the last (R9.10).

>>> games, scored_in = score_hand(HOLLYWOOD_GAMES, winner=0, wins=2, points=30, target=100)
>>> scored_in, [g.scores for g in games]
([1, 2], [(30, 0), (30, 0), (0, 0)])
"""

from __future__ import annotations

from shared.contracts.events import GameColumn, SeatTally
from shared.contracts.options import TableOptions
from shared.engine.scoring import tally
from shared.engine.state import GameScore

GAMES = 3
HOLLYWOOD_GAMES = (GameScore(),) * GAMES  # a new match's games, all empty

__all__ = ["HOLLYWOOD_GAMES", "columns", "games_of", "match_winner", "score_hand", "summed"]


def games_of(options: TableOptions) -> tuple[GameScore, ...]:
    """The games a new match starts with: three empty ones at a Hollywood table, else none."""
    return HOLLYWOOD_GAMES if options.hollywood else ()


def score_hand(
    games: tuple[GameScore, ...], winner: int, wins: int, points: int, target: int
) -> tuple[tuple[GameScore, ...], list[int]]:
    """The games after ``winner`` won their ``wins``-th hand for ``points`` (R9.7 to R9.9),
    and the numbers of the games the points went into (none when those games had closed)."""
    out = []
    scored_in = []
    for number, game in enumerate(games, start=1):
        if number <= wins and not game.closed:
            mine = game.scores[winner] + points
            game = GameScore(
                scores=_with(game.scores, winner, mine),
                boxes=_with(game.boxes, winner, game.boxes[winner] + 1),
                winner=winner if mine >= target else None,
            )
            scored_in.append(number)
        out.append(game)
    return tuple(out), scored_in


def match_winner(games: tuple[GameScore, ...]) -> int | None:
    """The seat that won at least two of the three games (R9.11); None while fewer closed."""
    for seat in (0, 1):
        if sum(game.winner == seat for game in games) * 2 > GAMES:
            return seat
    return None


def columns(
    options: TableOptions, games: tuple[GameScore, ...], final: bool = False
) -> list[GameColumn]:
    """The games as columns: each with its tally once closed (R9.9), or, when ``final`` (the
    match is over), every one with its tally; an open game gets no bonuses (R9.12)."""
    return [
        GameColumn(
            game=number,
            scores=list(game.scores),
            boxes=list(game.boxes),
            closed=game.closed,
            winner=game.winner,
            tally=_tally(options, game) if game.closed or final else None,
        )
        for number, game in enumerate(games, start=1)
    ]


def summed(options: TableOptions, games: tuple[GameScore, ...]) -> list[SeatTally]:
    """The match's final tally: each seat's three game tallies added up (R9.11, R9.12)."""
    tallies = [_tally(options, game) for game in games]
    return [
        SeatTally(
            points=sum(t[seat].points for t in tallies),
            hands_won=sum(t[seat].hands_won for t in tallies),
            game_bonus=sum(t[seat].game_bonus for t in tallies),
            box_bonus=sum(t[seat].box_bonus for t in tallies),
            total=sum(t[seat].total for t in tallies),
        )
        for seat in (0, 1)
    ]


def _tally(options: TableOptions, game: GameScore) -> list[SeatTally]:
    """A game's tally (R9.9): bonuses only once it closed."""
    return tally(options, game.scores, game.boxes, game.winner, bonuses=game.closed)


def _with(pair: tuple[int, int], seat: int, value: int) -> tuple[int, int]:
    return (value, pair[1]) if seat == 0 else (pair[0], value)
