"""What the timer service reports on /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.timers.deadlines import KINDS

LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class TimerMetrics:
    """Deadlines due and not fired yet, fired, and the lag from due to fired."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pending = Gauge(
            "gin_timer_deadlines_pending",
            "Deadlines due and not fired yet, when this replica last counted",
            ["kind"],
            registry=registry,
        )
        self.fired = Counter(
            "gin_timer_deadlines_fired",
            "Deadlines this replica fired (first firings only)",
            ["kind"],
            registry=registry,
        )
        self.resent = Counter(
            "gin_timer_expiry_resent",
            "Expire commands sent again because the table had not reported its expiry",
            registry=registry,
        )
        self.lag = Histogram(
            "gin_timer_fire_lag_seconds",
            "From a deadline's due time to its firing",
            ["kind"],
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        for kind in KINDS:  # every series exists from the start, at 0
            self.pending.labels(kind)
            self.fired.labels(kind)
            self.lag.labels(kind)
