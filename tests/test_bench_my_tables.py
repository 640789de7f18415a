"""The my-tables bench's pure part (bench/my_tables.py): its latency summary. No database."""

from __future__ import annotations

from bench.my_tables import summary


def test_the_summary_gives_the_median_the_99th_percentile_and_the_worst() -> None:
    samples = [float(n) for n in range(1, 201)]  # 1 to 200 ms, shuffled order does not matter
    figures = summary(list(reversed(samples)))
    assert figures == {"n": 200, "p50_ms": 100.5, "p99_ms": 199.0, "max_ms": 200.0}
    assert summary([3.0]) == {"n": 1, "p50_ms": 3.0, "p99_ms": 3.0, "max_ms": 3.0}
