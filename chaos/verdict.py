"""The pure part of ``make chaos-cluster``'s report (chaos/cluster.py): an event id seen with
two bodies, the players' latency by window, and the decision to fail. No I/O here."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import msgspec

from shared.contracts.envelope import envelope_decoder

EventId = tuple[str, str, int]  # stream, table_id, seq: an event's position, never reused

# Each must be 0 for the run to pass. A 503 during a failover is the service saying "retry";
# a 500 is a failure it did not handle, so those are counted apart and fail the run too.
MUST_BE_ZERO = (
    "lost_acked",
    "seq_reused",
    "audit_missing",
    "order_breaks",
    "stuck",
    "dead_lettered",
    "http_500",
    "fault_errors",
)


def canonical(body: str | bytes) -> str:
    """An envelope as one canonical JSON text: decoded as the contract's ``Envelope`` (so that
    the log's jsonb, the relay's bytes and a socket's re-encoding compare equal when they say
    the same), keys sorted. A body that is no envelope is compared as sorted JSON.

    >>> a = '{"id": "6f1c2a4e-0000-4000-8000-000000000000", "type": "table_closed",'
    >>> a += ' "table_id": "t", "seq": 3, "occurred_at": "2026-12-03T18:02:39.114Z",'
    >>> a += ' "data": {"type": "table_closed", "reason": "left"}}'
    >>> b = json.dumps(dict(reversed(list(json.loads(a).items()))))
    >>> canonical(a) == canonical(b)
    True
    """
    try:
        value: Any = msgspec.to_builtins(envelope_decoder.decode(body))
    except (msgspec.DecodeError, msgspec.ValidationError):
        value = json.loads(body)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def event_id(envelope: Mapping[str, Any]) -> EventId:
    """The position of a decoded envelope (``stream`` absent: an older ``table`` event)."""
    return (str(envelope.get("stream", "table")), str(envelope["table_id"]), int(envelope["seq"]))


def reused_ids(seen: Iterable[tuple[EventId, str]]) -> dict[EventId, int]:
    """Event ids seen with more than one body (canonical JSON), and how many bodies each.

    >>> reused_ids([(("table", "t", 1), "a"), (("table", "t", 1), "a"), (("table", "t", 2), "b"),
    ...             (("table", "t", 2), "c"), (("chat", "t", 2), "d")])
    {('table', 't', 2): 2}
    """
    bodies: dict[EventId, set[str]] = {}
    for key, body in seen:
        bodies.setdefault(key, set()).add(body)
    return {key: len(b) for key, b in bodies.items() if len(b) > 1}


def p99(values: list[float]) -> float:
    """The 99th percentile, nearest rank.

    >>> p99([float(v) for v in range(1, 101)]), p99([5.0]), p99([1.0, 2.0])
    (99.0, 5.0, 2.0)
    """
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def windows(samples: Iterable[tuple[float, float]], width_s: float = 10.0) -> list[dict[str, Any]]:
    """Latency samples (at seconds since play began, latency in seconds) as windows of
    ``width_s``: each window's start, sample count, p99 and maximum in milliseconds; empty
    windows left out. With a few players at once a stall is a few samples among hundreds:
    the maximum shows it where the p99 may not.

    >>> windows([(0.5, 0.010), (9.9, 0.030), (10.0, 1.0), (31.0, 0.2)])[:2]
    [{'start_s': 0, 'n': 2, 'p99_ms': 30.0, 'max_ms': 30.0},\
 {'start_s': 10, 'n': 1, 'p99_ms': 1000.0, 'max_ms': 1000.0}]
    """
    buckets: dict[int, list[float]] = {}
    for at, latency in samples:
        buckets.setdefault(int(at // width_s), []).append(latency)
    return [
        {
            "start_s": round(index * width_s),
            "n": len(buckets[index]),
            "p99_ms": round(p99(buckets[index]) * 1000, 1),
            "max_ms": round(max(buckets[index]) * 1000, 1),
        }
        for index in sorted(buckets)
    ]


def counts_by_window(stamps: Iterable[str], since: float, width_s: float = 10.0) -> dict[int, int]:
    """RFC 3339 times (an envelope's ``occurred_at``) counted by window of seconds after the
    Unix time ``since``: when the events a check names happened, to set beside the faults.

    >>> counts_by_window(["1970-01-01T00:01:45Z", "1970-01-01T00:01:49.5Z",
    ...                   "1970-01-01T00:02:01+00:00"], since=100.0)
    {0: 2, 20: 1}
    """
    counts: dict[int, int] = {}
    for stamp in stamps:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - since
        start = round((at // width_s) * width_s)
        counts[start] = counts.get(start, 0) + 1
    return dict(sorted(counts.items()))


def worst_after(
    by_window: list[dict[str, Any]],
    at_s: float,
    span_s: float = 60.0,
    width_s: float = 10.0,
    key: str = "p99_ms",
) -> dict[str, Any] | None:
    """The window of highest ``key`` (p99) among those overlapping ``[at_s, at_s + span_s)``.

    >>> w = [{"start_s": 0, "n": 3, "p99_ms": 900.0}, {"start_s": 10, "n": 3, "p99_ms": 50.0},
    ...      {"start_s": 20, "n": 3, "p99_ms": 400.0}, {"start_s": 90, "n": 3, "p99_ms": 999.0}]
    >>> worst_after(w, 12.0)
    {'start_s': 20, 'n': 3, 'p99_ms': 400.0}
    >>> worst_after(w, 200.0) is None
    True
    """
    after = [w for w in by_window if w["start_s"] + width_s > at_s and w["start_s"] < at_s + span_s]
    return max(after, key=lambda w: w[key]) if after else None


def failed(report: Mapping[str, Any]) -> list[str]:
    """The counts of the report that are not 0 (a missing count fails: it was not measured).

    >>> failed({k: 0 for k in MUST_BE_ZERO})
    []
    >>> failed({**{k: 0 for k in MUST_BE_ZERO}, "lost_acked": 2, "http_5xx": 40})
    ['lost_acked']
    """
    return [key for key in MUST_BE_ZERO if report.get(key, 1) != 0]
