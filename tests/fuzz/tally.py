"""The fuzz tests' tally, printed at the end of the run: how many requests and frames each
part sent, and (``GIN_FUZZ_VERBOSE=1``) what each operation answered.

The tests count in the process that runs them. Under ``make test``'s two workers
(pytest-xdist) that is a worker, so each worker hands its counts to the controller when it
finishes (``config.workeroutput``), and the controller, which prints the summary, adds them up
(the hooks are in ``tests/conftest.py``, which the controller loads; this directory's conftest
it does not). The time spent is counted where the reports arrive: the controller, or the one
process of a run without workers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

CASES: Counter[str] = Counter()  # requests and frames sent, by kind
ANSWERS: defaultdict[str, Counter[str]] = defaultdict(Counter)  # statuses by operation
SPENT: list[float] = [0.0]  # seconds in the fuzz tests (setup and teardown included)


def handed_over() -> dict[str, Any]:
    """A worker's counts, as plain data for ``workeroutput``."""
    return {
        "cases": dict(CASES),
        "answers": {operation: dict(statuses) for operation, statuses in ANSWERS.items()},
    }


def add(output: dict[str, Any]) -> None:
    """Add a worker's handed-over counts to this process's."""
    CASES.update(output.get("cases", {}))
    for operation, statuses in output.get("answers", {}).items():
        ANSWERS[operation].update(statuses)


def summary(verbose: bool) -> list[str]:
    """The summary's lines: none when no fuzz test ran."""
    if not CASES:
        return []
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(CASES.items()))
    lines = [f"fuzz: {sum(CASES.values())} cases in {SPENT[0]:.0f} s ({parts})"]
    if verbose:
        lines += [f"  {op}: {dict(sorted(s.items()))}" for op, s in sorted(ANSWERS.items())]
    return lines
