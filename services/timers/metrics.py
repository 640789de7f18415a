"""What the timer service reports on /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.timers.deadlines import kinds_of

LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class TimerMetrics:
    """Deadlines due and not fired yet, fired, the lag from due to fired, and the turn
    reminders sent (``kind`` of a reminder offset: ``reminder:<seconds>``)."""

    def __init__(self, registry: CollectorRegistry, reminders_s: tuple[int, ...] = ()) -> None:
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
        self.reminders = Counter(
            "gin_timer_reminders_sent",
            "Turn reminders sent, by reminder (its offset in seconds, or claimable)",
            ["reminder"],
            registry=registry,
        )
        self.reminders_skipped = Counter(
            "gin_timer_reminders_skipped",
            "Turn reminders not sent because the next one was due already (the timers were"
            " down across both)",
            ["reminder"],
            registry=registry,
        )
        for kind in kinds_of(reminders_s):  # every series exists from the start, at 0
            self.pending.labels(kind)
            self.fired.labels(kind)
            self.lag.labels(kind)
        for offset in reminders_s:
            self.reminders.labels(str(offset))
            self.reminders_skipped.labels(str(offset))
        if reminders_s:
            self.reminders.labels("claimable")
