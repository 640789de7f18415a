"""Two strategies play whole matches with the engine, each deal twice with the seats swapped.

``python -m services.bots.tournament --a luna --b carmen --matches 1000 --seed 7 --workers 2``

Matches come in mirrored pairs: both matches of a pair are dealt the same decks in the same
order (and the same first dealer by lot), with the strategies in swapped seats, so the luck of
the cards cancels out. Each seat decides from exactly the ``TableView`` a bot gets
(``seat_table_view``) with an RNG seeded from the table id and version, as the worker does.
Progress goes to stderr; the last stdout line is one JSON object with the results.
Matches are played to 100 points unless ``--target`` says otherwise. Decisions are timed twice:
``decision_ms`` is wall-clock time, ``decision_cpu_ms`` the deciding thread's CPU time (what one
decision costs one core, whatever else the machine is running).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.bots.strategies import Strategy, load
from shared.contracts import commands as c
from shared.contracts.events import AnyEvent, HandEnded, MatchEnded, Player
from shared.contracts.options import TableOptions
from shared.engine.game import apply, deal, new_game, to_act
from shared.engine.state import GameState, Timing
from shared.engine.view import seat_table_view

TIMING = Timing(now=0.0)
MAX_STEPS = 20_000  # a match never needs this many moves; a loop would be a strategy bug
LABELS = ("a", "b")


class IllegalMove(Exception):
    """A strategy answered with a command that is not in its view's ``legal``."""


@dataclass
class MatchResult:
    """One match: who won and what happened in its hands, by strategy label ("a" or "b")."""

    pair: int
    winner: str
    hands: int = 0
    dead_hands: int = 0
    points: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})
    knocks: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})
    gins: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})
    big_gins: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})
    undercuts: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})
    decision_s: dict[str, list[float]] = field(default_factory=lambda: {"a": [], "b": []})
    decision_cpu_s: dict[str, list[float]] = field(default_factory=lambda: {"a": [], "b": []})


def deck_for(seed: int, pair: int, number: int) -> list[int]:
    """The shuffled deck of the ``number``-th deal of a pair's matches."""
    deck = list(range(52))
    random.Random(f"deck/{seed}/{pair}/{number}").shuffle(deck)
    return deck


def lot_for(seed: int, pair: int) -> int:
    """The seat that deals first in both matches of a pair (R3.2)."""
    return random.Random(f"lot/{seed}/{pair}").randrange(2)


def play_match(
    specs: tuple[str, str], a_seat: int, seed: int, pair: int, options: TableOptions
) -> MatchResult:
    """One whole match to the target; strategy "a" sits in ``a_seat``."""
    labels = (LABELS[a_seat], LABELS[1 - a_seat])  # seat 0 is "a" unless a sits in seat 1
    by_seat = (load(specs[a_seat]), load(specs[1 - a_seat]))
    seats: list[Player | None] = [Player(name=specs[a_seat]), Player(name=specs[1 - a_seat])]
    table_id = f"tournament-{seed}-{pair}-{a_seat}"
    result = MatchResult(pair=pair, winner="")
    state, _ = new_game(options, TIMING)
    deals = 0
    for version in range(MAX_STEPS):
        if state.status != "playing":
            break
        if state.needs_deal:
            deck = deck_for(seed, pair, deals)
            state, events = deal(state, deck, f"{seed}/{pair}/{deals}", lot_for(seed, pair), TIMING)
            deals += 1
        else:
            state, events = _move(state, by_seat, labels, result, table_id, version, seats)
        _record(events, labels, result)
    else:
        raise RuntimeError(f"match {table_id} did not end in {MAX_STEPS} moves")
    if not result.winner:
        raise RuntimeError(f"match {table_id} ended without a winner")
    return result


def _move(
    state: GameState,
    by_seat: tuple[Strategy, Strategy],
    labels: tuple[str, str],
    result: MatchResult,
    table_id: str,
    version: int,
    seats: list[Player | None],
) -> tuple[GameState, list[AnyEvent]]:
    """Ask the seat to act for its command, timing the decision, and apply it."""
    seat = to_act(state)
    assert seat is not None
    view = seat_table_view(
        state,
        seat,
        TIMING,
        table_id=table_id,
        version=version,
        status=state.status,
        seats=seats,
        options=state.options,
    )
    rng = random.Random(f"{table_id}:{version}")
    start, cpu_start = time.perf_counter(), time.thread_time()
    command = by_seat[seat](view, rng)
    result.decision_cpu_s[labels[seat]].append(time.thread_time() - cpu_start)
    result.decision_s[labels[seat]].append(time.perf_counter() - start)
    if command not in view.legal or isinstance(command, c.Resign | c.Leave):
        raise IllegalMove(f"{labels[seat]} sent {command!r}, not a move of {view.legal!r}")
    return apply(state, seat, command, TIMING)


def _record(events: Sequence[AnyEvent], labels: tuple[str, str], result: MatchResult) -> None:
    """Count one step's hand results and the match winner."""
    for event in events:
        if isinstance(event, HandEnded):
            result.hands += 1
            if event.how == "dead_hand" or event.winner is None:
                result.dead_hands += 1
                continue
            who = labels[event.winner]
            result.points[who] += event.points
            tally = {
                "knock": result.knocks,
                "gin": result.gins,
                "big_gin": result.big_gins,
                "undercut": result.undercuts,
            }.get(event.how)
            if tally is not None:
                tally[who] += 1
        elif isinstance(event, MatchEnded) and event.winner is not None:
            result.winner = labels[event.winner]


def play_pair(task: tuple[tuple[str, str], int, int, int], target: int = 100) -> list[MatchResult]:
    """Both matches of a pair (or only the first when the match count is odd), to ``target``."""
    specs, seed, pair, count = task
    options = TableOptions(target=target)
    return [play_match(specs, a_seat, seed, pair, options) for a_seat in range(count)]


def wilson(wins: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a win rate (95% for z = 1.96)."""
    if n == 0:
        return (0.0, 1.0)
    return _wilson_rate(wins / n, n, z)


def paired_interval(results: Sequence[MatchResult], z: float = 1.96) -> tuple[float, float, float]:
    """The 95% interval of the first strategy's win rate, mirrored pairs counted as pairs, and
    its design effect.

    The two matches of a pair share their decks, so they are not independent draws: a deck
    sequence where skill tells gives the stronger side both, one where luck rules splits them.
    The pair is the unit sampled. The win rate's variance is estimated over pairs (a ratio
    estimator: a pair's wins less the rate times its matches), and its ratio to the binomial
    variance of as many independent matches (the design effect) scales the Wilson interval's
    count: ``wilson`` at ``matches / effect`` matches. An effect above 1 widens the interval;
    one of 0 (every pair exactly at the rate, nothing to scale) leaves Wilson's as it is.
    """
    by_pair: dict[int, list[int]] = {}
    for r in results:
        by_pair.setdefault(r.pair, []).append(r.winner == "a")
    n = len(results)
    wins = sum(sum(pair) for pair in by_pair.values())
    if n == 0:
        return (0.0, 1.0, 1.0)
    p = wins / n
    clusters = len(by_pair)
    effect = 1.0
    if clusters > 1 and 0 < p < 1:
        spread = sum((sum(pair) - p * len(pair)) ** 2 for pair in by_pair.values())
        variance = clusters / (clusters - 1) * spread / (n * n)
        effect = variance / (p * (1 - p) / n)
    low, high = _wilson_rate(p, n / effect if effect > 0 else n, z)
    return (low, high, effect)


def _wilson_rate(p: float, n: float, z: float) -> tuple[float, float]:
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0..100) of sorted values."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _timing_summary(seconds: list[float]) -> dict[str, float]:
    values = sorted(seconds)
    mean = sum(values) / len(values) if values else 0.0
    return {
        "p50": round(percentile(values, 50) * 1000, 3),
        "p99": round(percentile(values, 99) * 1000, 3),
        "mean": round(mean * 1000, 3),
        "max": round(values[-1] * 1000, 3) if values else 0.0,
        "n": len(values),
    }


def summarize(specs: tuple[str, str], results: Sequence[MatchResult]) -> dict[str, Any]:
    """The tournament's JSON result: wins with a 95% interval (``paired_interval``), hand
    statistics, timings."""
    n = len(results)
    a_wins = sum(r.winner == "a" for r in results)
    hands = sum(r.hands for r in results)

    def both(name: str) -> dict[str, int]:
        return {x: sum(getattr(r, name)[x] for r in results) for x in LABELS}

    points = both("points")
    low, high, effect = paired_interval(results)
    return {
        "a": specs[0],
        "b": specs[1],
        "matches": n,
        "a_wins": a_wins,
        "b_wins": n - a_wins,
        "a_win_rate": round(a_wins / n, 4) if n else 0.0,
        "ci95": [round(low, 4), round(high, 4)],  # mirrored pairs counted as pairs
        "design_effect": round(effect, 3),  # its variance over that of independent matches
        "hands": hands,
        "points_per_hand": {x: round(points[x] / hands, 3) if hands else 0.0 for x in LABELS},
        "knocks": both("knocks"),
        "gins": both("gins"),
        "big_gins": both("big_gins"),
        "undercuts": both("undercuts"),
        "dead_hands": sum(r.dead_hands for r in results),
        "decision_ms": {
            x: _timing_summary([s for r in results for s in r.decision_s[x]]) for x in LABELS
        },
        # CPU time of the deciding thread: what a decision costs one core, whatever else the
        # machine runs (the wall-clock figures above count the time other processes took)
        "decision_cpu_ms": {
            x: _timing_summary([s for r in results for s in r.decision_cpu_s[x]]) for x in LABELS
        },
    }


def run(
    specs: tuple[str, str],
    matches: int,
    seed: int,
    workers: int,
    progress: bool = True,
    target: int = 100,
) -> dict[str, Any]:
    """Play ``matches`` matches to ``target`` in mirrored pairs on ``workers`` processes; the
    JSON result."""
    for spec in specs:
        load(spec)  # fail fast on a bad spec
    tasks = [(specs, seed, pair, min(2, matches - 2 * pair)) for pair in range((matches + 1) // 2)]
    one_pair = functools.partial(play_pair, target=target)
    results: list[MatchResult] = []
    start = time.perf_counter()
    step = max(1, len(tasks) // 20)
    if workers <= 1:
        results = _collect(map(one_pair, tasks), len(tasks), step, start, progress)
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            batches = pool.imap_unordered(one_pair, tasks, chunksize=1)
            results = _collect(batches, len(tasks), step, start, progress)
    results.sort(key=lambda r: r.pair)
    summary = summarize(specs, results)
    summary.update(
        seed=seed, target=target, workers=workers, elapsed_s=round(time.perf_counter() - start, 1)
    )
    return summary


def _collect(
    batches: Iterable[list[MatchResult]], total: int, step: int, start: float, progress: bool
) -> list[MatchResult]:
    results: list[MatchResult] = []
    for done, batch in enumerate(batches, 1):
        results.extend(batch)
        if progress and (done % step == 0 or done == total):
            a_wins = sum(r.winner == "a" for r in results)
            print(
                f"{done}/{total} pairs, {len(results)} matches, a won {a_wins} "
                f"({a_wins / len(results):.1%}), {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: play the tournament and print its JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    spec_help = "a level (tito, carmen, luna) or module:callable"
    parser.add_argument("--a", required=True, help=spec_help)
    parser.add_argument("--b", required=True, help=spec_help)
    parser.add_argument("--matches", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--target", type=int, default=100, help="points a match is played to")
    args = parser.parse_args(argv)
    if args.matches < 1:
        parser.error("--matches must be at least 1")
    if args.target < 1:
        parser.error("--target must be at least 1")
    summary = run(
        (args.a, args.b), args.matches, args.seed, max(1, args.workers), True, args.target
    )
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
