"""Bot strength (issues 18, 35): mirrored tournaments between the levels and two yardsticks.

Each pairing is one ``services.bots.tournament`` run (mirrored pairs of matches to 100 points,
each seat deciding from its own view only) and prints one JSON line: the first strategy's
share of the matches with its 95% interval (the pair as the unit: ``tournament.paired_interval``)
and that interval's design effect, the goals it is held to, and both
strategies' decision times in ms (p50, p99, mean, max), as wall-clock time and as the deciding
thread's CPU time (one core's cost, whatever else the machine runs). ``BENCH_BOTS_MATCHES``
(2000), ``BENCH_BOTS_SEED`` (7) and ``BENCH_BOTS_WORKERS`` (2) change the runs.
"""

from __future__ import annotations

import json
import os

from services.bots import tournament

SIMPLE = "services.bots.strategies.simple:decide"
HUNTER = "services.bots.strategies.hunter:decide"
# (a, b, a short name for b, the share of matches a must win): issue 35's goals. LUNA is held
# to both yardsticks, the early knocker and the patient gin hunter.
PAIRINGS = (
    ("luna", SIMPLE, "simple", 0.78),
    ("luna", HUNTER, "gin_hunter", 0.60),
    ("luna", "carmen", "carmen", 0.75),
    ("carmen", "tito", "tito", 0.75),
)
# The most a decision of the first strategy may take, in wall-clock ms: (p99, slowest).
DECISION_GOAL_MS = (100.0, 300.0)


def main() -> None:
    """Play every pairing and print one JSON line each."""
    matches = int(os.environ.get("BENCH_BOTS_MATCHES", "2000"))
    seed = int(os.environ.get("BENCH_BOTS_SEED", "7"))
    workers = int(os.environ.get("BENCH_BOTS_WORKERS", "2"))
    for a, b, b_name, goal in PAIRINGS:
        result = tournament.run((a, b), matches, seed, workers, progress=False)
        wall, cpu = result["decision_ms"], result["decision_cpu_ms"]
        line = {
            "bench": f"bots_{a}_vs_{b_name}",
            "matches": result["matches"],
            "win_rate": result["a_win_rate"],
            "ci95": result["ci95"],
            "design_effect": result["design_effect"],
            "goal": goal,
            "decision_goal_ms": {"p99": DECISION_GOAL_MS[0], "max": DECISION_GOAL_MS[1]},
            "points_per_hand": {
                a: result["points_per_hand"]["a"],
                b_name: result["points_per_hand"]["b"],
            },
            "decision_ms": {a: wall["a"], b_name: wall["b"]},
            "decision_cpu_ms": {a: cpu["a"], b_name: cpu["b"]},
            "seed": seed,
            "workers": workers,
            "elapsed_s": result["elapsed_s"],
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
