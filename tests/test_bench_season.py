"""The season bench's pure parts (bench/season.py): the season's shape, the hand records it
copies and its summary. No database."""

from __future__ import annotations

import json

from bench.season import events_of, goals, hand_records, season_shape


def test_each_table_has_60_to_200_events_and_the_season_about_as_many_as_asked() -> None:
    assert {events_of(n) for n in range(1000)} == set(range(60, 201))
    tables, events = season_shape(1_000_000)
    assert abs(events - 1_000_000) / 1_000_000 < 0.01
    assert events == sum(events_of(n) for n in range(tables))


def test_hand_records_are_whole_end_of_hand_records() -> None:
    records = [json.loads(r) for r in hand_records(3)]
    assert len(records) == 3
    for record in records:
        assert record["type"] == "hand_ended"
        assert len(record["deck"]) == 52
        assert len(record["seats"]) == 2


def _round(p99_ms: float, answer_ms: float, service: float) -> dict[str, object]:
    return {
        "_latencies_ms": [1.0] * 99 + [p99_ms],
        "command_to_answer_p99_ms": answer_ms,
        "cpu_ms_per_move": {"service": service, "relay": 0.5, "postgresql": 9.0},
        "machine_cpu_ms_per_move": 4.0,
        "this_postgresql_cpu_ms_per_s": {"backends": 100.0, "autovacuum": 50.0, "unseen": 10.0},
        "per_s": 100.0,
    }


def test_goals_compare_the_rounds_with_the_season_to_those_without() -> None:
    sizes = {
        t: {"total_bytes": 10, "heap_bytes": 8, "live_rows": 5}
        for t in ("events", "commands", "hands", "tables")
    }
    summary = goals(
        [_round(100.0, 50.0, 1.5), _round(100.0, 70.0, 1.5)],
        [_round(200.0, 90.0, 3.5), _round(200.0, 110.0, 3.5)],
        {"events": 1000, "fill_s": 1.0},
        {
            "seconds": 2.5,
            "done": {"command_answers": 3},
            "next_seconds": 0.1,
            "next_done": {"command_answers": 0},
            "sizes_before": sizes,
            "sizes_after": sizes,
        },
    )
    assert summary["pooled_p99_ms_without"] == 100.0
    assert summary["p99_ratio"] == 2.0
    assert summary["answer_p99_ratio"] == 1.667
    assert summary["cpu_ms_per_move_without"] == 3.0
    assert summary["cpu_ratio"] == 1.667
    assert summary["machine_cpu_ratio"] == 1.0
    assert summary["maintenance_s_first_run"] == 2.5
    assert summary["maintenance_s_next_run"] == 0.1
    assert summary["autovacuum_cpu_ms_per_move_with"] == 0.6
