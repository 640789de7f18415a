"""Engine benchmarks (issue 2): the meld search, layoffs and whole random hands.

Medians and p99 of single calls over seeded random inputs, and hands per second for two
random-legal players with ``legal`` computed at every step, on one core.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from shared.contracts import commands as c
from shared.contracts.options import TableOptions
from shared.engine import (
    Timing,
    apply,
    best_arrangement,
    best_layoffs,
    deal,
    legal,
    new_game,
    to_act,
    view,
)
from shared.engine.cards import CARDS

SEED = 20261202


def emit(**fields: Any) -> None:
    """One benchmark result as one JSON line."""
    print(json.dumps(fields), flush=True)


def per_call(name: str, fn: Callable[[Any], object], inputs: Sequence[Any]) -> None:
    """Median and p99 of one call per input, in microseconds."""
    for x in inputs[:200]:  # warm up
        fn(x)
    clock = time.perf_counter_ns
    times = []
    for x in inputs:
        start = clock()
        fn(x)
        times.append(clock() - start)
    times.sort()
    emit(
        bench=name,
        median_us=round(statistics.median(times) / 1000, 2),
        p99_us=round(times[int(len(times) * 0.99)] / 1000, 2),
        n=len(times),
    )


def random_hands(size: int, n: int, rng: random.Random) -> list[tuple[int, ...]]:
    """``n`` random hands of ``size`` cards."""
    return [tuple(CARDS[x] for x in rng.sample(range(52), size)) for _ in range(n)]


def knock_cases(n: int, rng: random.Random) -> list[tuple[Any, tuple[int, ...]]]:
    """Knocker melds of low-deadwood random hands with a random defender hand."""
    cases = []
    while len(cases) < n:
        deck = rng.sample(range(52), 20)
        knocker = best_arrangement(deck[:10])
        if knocker.melds:
            cases.append((knocker.melds, tuple(deck[10:])))
    return cases


def random_hands_per_second(seconds: float, rng: random.Random) -> None:
    """Whole hands between two players choosing uniformly among ``legal`` (never resigning)."""
    timing = Timing(now=0.0)
    quits = (c.Resign, c.Leave)
    hands = steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        state, _ = new_game(TableOptions(target=10_000), timing)
        deck = list(range(52))
        rng.shuffle(deck)
        state, _ = deal(state, deck, "00", rng.randrange(2), timing)
        while state.hand is not None:
            seat = to_act(state)
            assert seat is not None
            moves = [m for m in legal(state, seat, timing) if type(m) not in quits]
            state, _ = apply(state, seat, rng.choice(moves), timing)
            steps += 1
        hands += 1
    elapsed = time.perf_counter() - start
    emit(
        bench="random_hands",
        per_s=round(hands / elapsed, 1),
        steps_per_hand=round(steps / hands, 1),
        n=hands,
    )


def views_per_second(seconds: float, rng: random.Random) -> None:
    """Seat views (cards, SOBRA arrangement) built per second in mid-hand positions."""
    timing = Timing(now=0.0)
    state, _ = new_game(TableOptions(), timing)
    deck = list(range(52))
    rng.shuffle(deck)
    state, _ = deal(state, deck, "00", 0, timing)
    state, _ = apply(state, 1, c.PassUpcard(), timing)
    state, _ = apply(state, 0, c.PassUpcard(), timing)
    state, _ = apply(state, 1, c.Draw(source="stock"), timing)  # 11 cards: the hard view
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        view(state, 1)
        n += 1
    emit(bench="seat_view_11_cards", per_s=round(n / (time.perf_counter() - start), 1), n=n)


def main() -> None:
    """Run every engine benchmark."""
    rng = random.Random(SEED)
    per_call("best_arrangement_10", best_arrangement, random_hands(10, 10_000, rng))
    per_call("best_arrangement_11", best_arrangement, random_hands(11, 10_000, rng))
    cases = knock_cases(10_000, rng)
    per_call("best_layoffs", lambda case: best_layoffs(*case), cases)
    random_hands_per_second(5.0, rng)
    views_per_second(2.0, rng)


if __name__ == "__main__":
    main()
