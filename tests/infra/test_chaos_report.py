"""make chaos's report (chaos/run.py) counts what it says: its examples hold, and a log line
that is not one JSON object (a traceback, a JSON array) is counted."""

from __future__ import annotations

import doctest
from pathlib import Path

import chaos.run
from chaos.run import non_json_lines


def test_the_counts_of_the_report_hold_their_examples() -> None:
    failed, attempted = doctest.testmod(chaos.run)
    assert attempted >= 3
    assert failed == 0


def test_a_line_that_is_not_one_json_object_is_counted(tmp_path: Path) -> None:
    log = tmp_path / "table-a.0.log"
    log.write_text('{"event": "ready"}\nTraceback (most recent call last):\n[1, 2]\n{"x": 1}\n')
    count, examples = non_json_lines([log])
    assert count == 2
    assert examples == [
        "table-a.0.log: Traceback (most recent call last):",
        "table-a.0.log: [1, 2]",
    ]
