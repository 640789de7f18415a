"""Per-identity rate limits (``shared.infra.ratelimit``) on a real PostgreSQL: fixed windows,
a Retry-After to the window's end, two replicas sharing one table, one statement per sync,
a database outage (through a proxy the test cuts) and bounded memory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, cast
from urllib.parse import urlsplit

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from shared.infra import db
from shared.infra.outbox import SQL_DIR
from shared.infra.ratelimit import Holds, Limit, RateLimited, RateLimiter
from shared.infra.settings import Settings
from tests.tcp_proxy import Proxy, through

START = 1_800_000_000.0  # a window start for any window length used here


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def schema(settings: Settings) -> AsyncIterator[str]:
    """A schema with the shared migrations (the outbox's and the rate limits')."""
    name = f"rate_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(settings.database_url)
    try:
        applied = await db.migrate(conn, name, SQL_DIR)
        assert "900_rate_limits.sql" in applied
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA "{name}" CASCADE')
        await conn.close()


@pytest.fixture
async def pool(settings: Settings, schema: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await db.create_pool(settings.database_url, schema, 2)
    try:
        yield pool
    finally:
        pool.terminate()


async def totals(pool: asyncpg.Pool) -> dict[tuple[str, str], int]:
    """The shared table: (action, identity) → count, over every window."""
    rows = await pool.fetch(
        "SELECT action, identity, sum(count)::int AS n FROM rate_limits GROUP BY 1, 2"
    )
    return {(row["action"], row["identity"]): row["n"] for row in rows}


def refused(limiter: RateLimiter, action: str, identity: str) -> RateLimited:
    with pytest.raises(RateLimited) as caught:
        limiter.check(action, identity)
    return caught.value


async def test_the_limit_refuses_until_the_window_ends_and_a_new_window_starts_afresh(
    pool: asyncpg.Pool,
) -> None:
    clock = Clock(START + 0.25)  # in the window [START, START + 10)
    limits = {"commands": Limit(3, 10.0), "joins": Limit(1, 10.0)}
    limiter = RateLimiter(pool, limits, 0.2, clock)
    for _ in range(3):
        limiter.check("commands", "ann")
    refusal = refused(limiter, "commands", "ann")
    assert (refusal.action, refusal.retry_after_s) == ("commands", 10)  # 9.75 s, rounded up
    clock.now = START + 9.5
    assert refused(limiter, "commands", "ann").retry_after_s == 1
    clock.now = START + 9.999
    assert refused(limiter, "commands", "ann").retry_after_s == 1  # never 0
    limiter.check("commands", "bob")  # each identity has its own count
    limiter.check("joins", "ann")  # and each action
    assert refused(limiter, "joins", "ann").action == "joins"

    clock.now = START + 10.0  # the next window
    for _ in range(3):
        limiter.check("commands", "ann")
    assert refused(limiter, "commands", "ann").retry_after_s == 10
    assert limiter.entries == 1  # the ended window's counts are gone


async def test_refusals_are_counted_by_action_and_cost_no_round_trip(pool: asyncpg.Pool) -> None:
    registry = CollectorRegistry()
    limiter = RateLimiter(pool, {"commands": Limit(5, 60.0)}, 0.2, Clock(), registry=registry)
    for _ in range(5):
        limiter.check("commands", "flood")
    began = time.perf_counter()
    for _ in range(20_000):  # 40 s of a 500/s flood
        with contextlib.suppress(RateLimited):
            limiter.check("commands", "flood")
    # No database in there: some microseconds each (a round trip would be 100 µs or more).
    assert time.perf_counter() - began < 1.0
    assert registry.get_sample_value("gin_rate_limited_total", {"action": "commands"}) == 20_000


async def test_two_replicas_share_one_total(pool: asyncpg.Pool) -> None:
    clock = Clock()
    limits = {"commands": Limit(10, 60.0)}
    a, b = (RateLimiter(pool, limits, 0.2, clock) for _ in range(2))
    for _ in range(6):  # at least half the limit: every replica learns the total
        a.check("commands", "ann")
    await a.sync()
    await b.sync()
    for _ in range(4):
        b.check("commands", "ann")
    assert refused(b, "commands", "ann").retry_after_s == 60  # 6 + 4: the shared total
    await b.sync()
    refused(b, "commands", "ann")  # the answer's snapshot of 6, before b's 4, is not taken
    a.check("commands", "ann")  # a has not heard of b's 4 yet: the error bound
    await a.sync()
    refused(a, "commands", "ann")
    assert await totals(pool) == {("commands", "ann"): 11}


async def test_a_replica_refuses_at_once_one_the_others_pushed_to_the_limit(
    pool: asyncpg.Pool,
) -> None:
    clock = Clock()
    limits = {"tables": Limit(4, 3600.0)}
    a, b = (RateLimiter(pool, limits, 0.2, clock) for _ in range(2))
    for _ in range(4):
        a.check("tables", "ann")
    refused(a, "tables", "ann")
    await a.sync()
    await b.sync()  # b has never counted ann
    assert refused(b, "tables", "ann").retry_after_s == 3600


async def test_a_count_below_half_is_learnt_at_the_replicas_first_sync_of_it(
    pool: asyncpg.Pool,
) -> None:
    clock = Clock()
    limits = {"joins": Limit(10, 60.0)}
    a, b = (RateLimiter(pool, limits, 0.2, clock) for _ in range(2))
    for _ in range(2):
        a.check("joins", "ann")
    await a.sync()
    await b.sync()
    b.check("joins", "ann")  # b counts 1, not knowing a's 2
    await b.sync()  # and the statement answers the total, 3
    for _ in range(7):
        b.check("joins", "ann")
    refused(b, "joins", "ann")
    assert await totals(pool) == {("joins", "ann"): 3}  # b's 7 wait for its next sync


async def test_counts_taken_while_a_sync_is_in_flight_are_kept(pool: asyncpg.Pool) -> None:
    limits = {"commands": Limit(20, 60.0)}
    a, b = (RateLimiter(pool, limits, 0.2, Clock()) for _ in range(2))
    for _ in range(4):
        b.check("commands", "ann")
    await b.sync()
    for _ in range(5):
        a.check("commands", "ann")
    in_flight = asyncio.create_task(a.sync())
    await asyncio.sleep(0)  # sent, waiting for the answer
    for _ in range(5):
        a.check("commands", "ann")
    await in_flight  # the total, 9, and a's 5 not sent yet
    for _ in range(6):
        a.check("commands", "ann")
    refused(a, "commands", "ann")
    await a.sync()
    assert await totals(pool) == {("commands", "ann"): 20}


class RecordingPool:
    """The pool, recording every statement its connections run."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.statements: list[str] = []

    def _record(self, query: Any) -> None:
        self.statements.append(query.query)

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[Any]:  # noqa: ASYNC109
        async with self.pool.acquire(timeout=timeout) as conn:
            conn.add_query_logger(self._record)
            try:
                yield conn
            finally:
                conn.remove_query_logger(self._record)


async def test_a_sync_is_one_statement(settings: Settings, schema: str) -> None:
    # One connection, used once first: asyncpg learns the array types on a connection's first
    # use of them (three statements of its own, once per connection, not per sync).
    one = await db.create_pool(settings.database_url, schema, 1)
    try:
        clock = Clock()
        recording = RecordingPool(one)
        limits = {"commands": Limit(1000, 60.0), "sockets": Limit(1000, 10.0)}
        limiter = RateLimiter(cast(asyncpg.Pool, recording), limits, 0.2, clock)
        await limiter.sync()  # the first also prunes what an earlier run left
        recording.statements.clear()

        expected: dict[tuple[str, str], int] = {}
        for n in range(50):
            for action in limits:
                for _ in range(n % 7 + 1):
                    limiter.check(action, f"player-{n}")
                expected[action, f"player-{n}"] = n % 7 + 1
        await limiter.sync()
        assert len(recording.statements) == 1
        assert await totals(one) == expected

        clock.now += 61.0  # every window ended, and it is time to prune again
        limiter.check("commands", "player-0")
        await limiter.sync()
        assert len(recording.statements) == 2
        assert await totals(one) == {("commands", "player-0"): 1}  # the ended windows are gone
        await limiter.sync()  # nothing to send: one statement still learns the others' totals
        assert len(recording.statements) == 3
    finally:
        one.terminate()


async def test_identities_postgresql_would_refuse_are_counted_as_digests(
    pool: asyncpg.Pool,
) -> None:
    clock = Clock()
    limits = {"commands": Limit(2, 60.0)}
    a, b = (RateLimiter(pool, limits, 0.2, clock) for _ in range(2))
    awkward = ["nul\x00byte", "x" * 100_000, "\ud800lone", "José", "~plain-looking"]
    for identity in awkward:
        a.check("commands", identity)
        a.check("commands", identity)
    await a.sync()  # not poisoned by any of them
    await b.sync()
    for identity in awkward:
        refused(b, "commands", identity)
    assert len(await totals(pool)) == len(awkward)
    b.check("commands", "plain")  # and the others are still counted apart


@pytest.fixture
async def proxy(settings: Settings) -> AsyncIterator[Proxy]:
    url = urlsplit(settings.database_url)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 5432)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.cut()


async def eventually(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    """Wait until ``condition()`` (a bool or an awaitable of one) is true."""
    async with asyncio.timeout(timeout_s):
        while True:
            value = condition()
            if await value if inspect.isawaitable(value) else value:
                return
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(limiter: RateLimiter) -> AsyncIterator[asyncio.Task[None]]:
    """``limiter.run()`` as a task, cancelled (and waited for) at the end."""
    task = asyncio.create_task(limiter.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_database_outage_leaves_the_checks_local_and_never_stops_the_syncs(
    settings: Settings, schema: str, pool: asyncpg.Pool, proxy: Proxy
) -> None:
    async def counted(expected: dict[tuple[str, str], int]) -> bool:
        return await totals(pool) == expected

    cut_off = await db.create_pool(through(settings.database_url, proxy.port), schema, 2)
    limiter = RateLimiter(cut_off, {"commands": Limit(5, 3600.0)}, 0.05)
    try:
        with capture_logs() as logs:
            async with running(limiter) as task:
                limiter.check("commands", "ann")
                limiter.check("commands", "ann")
                await eventually(lambda: counted({("commands", "ann"): 2}))

                await proxy.cut()
                for _ in range(3):
                    limiter.check("commands", "ann")
                refused(limiter, "commands", "ann")  # held on this replica's own counts
                limiter.check("commands", "bob")
                await eventually(lambda: any(e["event"] == "rate_limit_sync_failed" for e in logs))
                await asyncio.sleep(0.5)  # a few failed syncs, backing off
                assert not task.done()

                await proxy.start()  # the counts taken meanwhile reach the table
                await eventually(lambda: counted({("commands", "ann"): 5, ("commands", "bob"): 1}))
                assert not task.done()
                refused(limiter, "commands", "ann")
        assert task.cancelled()  # run() ended only when cancelled
    finally:
        cut_off.terminate()


async def test_two_running_replicas_hear_of_each_other_within_syncs(pool: asyncpg.Pool) -> None:
    limits = {"sockets": Limit(100, 3600.0)}
    a, b = (RateLimiter(pool, limits, 0.05) for _ in range(2))
    taken_by_b = 0

    def b_refuses() -> bool:
        nonlocal taken_by_b
        try:
            b.check("sockets", "ann")
        except RateLimited:
            return True
        taken_by_b += 1
        return False

    async with running(a), running(b):
        for _ in range(100):
            a.check("sockets", "ann")
        await eventually(b_refuses)  # a probe each 20 ms, syncs each 50 ms
        # b took a few before it heard (within two syncs), far from a limit of its own.
        assert taken_by_b < 50
        await eventually(lambda: b.entries == 1)
        await asyncio.sleep(0.2)  # b's last counts reach the table
    assert await totals(pool) == {("sockets", "ann"): 100 + taken_by_b}


async def test_memory_is_bounded_and_a_forgotten_identity_is_refused_after_one_sync(
    pool: asyncpg.Pool,
) -> None:
    clock = Clock()
    limiter = RateLimiter(pool, {"commands": Limit(3, 60.0)}, 0.2, clock, max_entries=10)
    for _ in range(3):
        limiter.check("commands", "ann")
    await limiter.sync()
    with capture_logs() as logs:
        for n in range(1000):  # identities rotated by an attacker
            limiter.check("commands", f"rotated-{n}")
            assert limiter.entries <= 10
    assert any(e["event"] == "rate_limit_entries_evicted" for e in logs)
    limiter.check("commands", "ann")  # forgotten: this replica takes one more...
    await limiter.sync()
    refused(limiter, "commands", "ann")  # ...until the table's total comes back
    assert limiter.entries <= 10

    clock.now += 60.0  # a new window: the old one's entries are dropped at once
    limiter.check("commands", "bob")
    assert limiter.entries == 1


async def test_the_limits_come_from_the_settings(pool: asyncpg.Pool) -> None:
    settings = Settings(
        rate_commands=7,
        rate_joins_window_s=5.0,
        rate_sync_s=0.5,
        rate_refusals=9,
        rate_preferences=4,
        rate_lists=11,
        rate_hold_interval_s=0.3,
        rate_hold_max_s=4.0,
        rate_holds_max=40,
    )
    limiter = RateLimiter.from_settings(pool, settings)
    assert limiter.limits == {
        "commands": Limit(7, 60.0),
        "joins": Limit(60, 5.0),
        "tables": Limit(120, 3600.0),
        "preferences": Limit(4, 60.0),
        "sockets": Limit(120, 60.0),
        "lists": Limit(11, 60.0),
        "refusals": Limit(9, 60.0),
    }
    assert limiter.sync_s == 0.5
    holds = limiter.holds
    assert (holds.interval_s, holds.max_s, holds.max_held) == (0.3, 4.0, 40)
    assert (holds.max_held_per_identity, holds.crowd) == (40, 20)  # one may take them all
    with pytest.raises(KeyError):
        limiter.check("chats", "ann")


async def test_holds_answer_an_identitys_refusals_one_per_interval_or_after_max_s() -> None:
    """The schedule is taken at the frozen clock: the first refusal goes at once, the next
    two wait their turn, the fourth's turn is past ``max_s``: it waits ``max_s``."""
    holds = Holds(0.05, 0.1, 100, clock=Clock())
    tasks = [asyncio.create_task(holds.hold("flooder")) for _ in range(4)]
    other = asyncio.create_task(holds.hold("someone-else"))
    await asyncio.sleep(0)
    assert [t.done() for t in tasks] == [True, False, False, False]
    assert other.done()  # an identity has its own schedule
    assert holds.held == 3
    assert await asyncio.gather(*tasks, other) == [True] * 5
    assert holds.held == 0


async def test_holds_are_bounded_per_identity_and_over_all() -> None:
    holds = Holds(30.0, 60.0, 3, max_held_per_identity=2, clock=Clock())
    assert await holds.hold("a") is True  # a first refusal is answered at once
    waiting = [asyncio.create_task(holds.hold("a")) for _ in range(2)]
    await asyncio.sleep(0)
    assert holds.held == 2
    assert await holds.hold("a") is False  # a third of one identity: answered at once
    waiting.append(asyncio.create_task(holds.hold("b")))
    assert await holds.hold("b") is True
    await asyncio.sleep(0)
    assert holds.held == 3
    assert await holds.hold("c") is True  # a first is never held, so needs no room
    assert await holds.hold("c") is False  # no room left over all: answered at once
    holds.release()
    async with asyncio.timeout(5):  # not the 30 s of their turn
        assert await asyncio.gather(*waiting) == [True, True, True]
    assert await holds.hold("d") is False  # released: nothing is held any more


@pytest.fixture
def no_collector_pauses() -> Iterator[None]:
    """Python's collector off for a test that times holds of some 20 ms: a full collection
    over a heap as large as make test's (the table app's modules loaded) paused it 38 ms."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_collector_pauses")
async def test_a_crowded_identitys_holds_last_longer_in_proportion_up_to_a_bound() -> None:
    """Past ``crowd`` held at once, an identity's next refusal is held n / ``crowd`` times as
    long (``MAX_STRETCH`` times at most): more connections get it no more answers a second.
    The holds' lengths are read where they are set (the loop's timers), not off the wall
    clock: a busy machine runs timers late, and a late timer says nothing of the rule."""
    holds = Holds(30.0, 0.02, 100, clock=Clock(), uniform=lambda low, high: high, crowd=2)
    assert await holds.hold("flooder") is True  # its first: at once, the next due in 30 s
    loop = asyncio.get_running_loop()
    waits: list[float] = []
    timer = loop.call_later

    def recorded(delay: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        waits.append(delay)
        return timer(delay, *args, **kwargs)

    loop.call_later = recorded  # type: ignore[method-assign]
    try:
        tasks = [asyncio.create_task(holds.hold("flooder")) for _ in range(60)]
        await asyncio.sleep(0)
        assert holds.held == 60
        other = await asyncio.wait_for(holds.hold("someone-else"), 1)  # a first: never held
        assert other is True
        assert await asyncio.gather(*tasks) == [True] * 60
    finally:
        del loop.call_later  # the loop's own method again
    holds_set = sorted(waits[:60])  # each hold's timer, in the order they were held
    assert waits[:60] == holds_set, "a later hold of the crowd is never shorter"
    assert holds_set[:2] == [0.02, 0.02]  # the first two of the crowd: max_s
    assert holds_set[19] == pytest.approx(0.02 * 10)  # the 20th: 20 / 2 = 10 times
    assert holds_set[-1] == pytest.approx(0.02 * 24)  # 60 / 2 = 30 times: 24 at most


@pytest.mark.usefixtures("no_collector_pauses")
async def test_a_long_hold_ends_once_its_client_has_gone() -> None:
    """A stretched hold asks ``gone`` every ``max_s``: a client that left keeps no hold (nor
    its identity's crowd) for the minutes it would have lasted."""
    holds = Holds(30.0, 0.05, 100, clock=Clock(), uniform=lambda low, high: high, crowd=1)
    assert await holds.hold("flooder") is True
    left = False
    tasks = [asyncio.create_task(holds.hold("flooder", lambda: left)) for _ in range(20)]
    await asyncio.sleep(0)
    assert holds.held == 20  # the n-th would wait n * 0.05 s: the last, 1 s
    await asyncio.sleep(0.1)
    left = True
    async with asyncio.timeout(0.05 * 3):
        assert await asyncio.gather(*tasks) == [True] * 20
    assert holds.held == 0


@pytest.mark.usefixtures("no_collector_pauses")
async def test_long_holds_are_asked_together_by_one_sweep_every_max_s() -> None:
    """Holds begun at different moments are asked whether their client has gone at the same
    moments, once every ``max_s`` (one timer for all, not a wake-up of each), and once none
    is held nothing is asked any more."""
    holds = Holds(30.0, 0.05, 100, clock=Clock(), uniform=lambda low, high: high, crowd=1)
    assert await holds.hold("flooder") is True
    loop = asyncio.get_running_loop()
    asked: list[float] = []

    def gone() -> bool:
        asked.append(loop.time())
        return False

    began = loop.time()
    tasks = []
    for _ in range(10):  # begun 7 ms apart: woken each on its own, 10 moments a max_s
        tasks.append(asyncio.create_task(holds.hold("flooder", gone)))
        await asyncio.sleep(0.007)
    await asyncio.sleep(0.16)
    sweeps = int((loop.time() - began) / 0.05)
    moments = [b for a, b in itertools.pairwise([-1.0, *sorted(asked)]) if b - a > 0.002]
    assert len(asked) >= 2 * 10  # each asked about every max_s
    assert len(moments) <= sweeps  # one sweep asks them all
    holds.release()
    assert await asyncio.gather(*tasks) == [True] * 10
    before = len(asked)
    await asyncio.sleep(0.12)
    assert len(asked) == before


async def test_a_client_that_asks_again_at_once_is_answered_no_faster_than_the_holds(
    pool: asyncpg.Pool,
) -> None:
    registry = CollectorRegistry()
    holds = Holds(0.05, 1.0, 10)
    limiter = RateLimiter(pool, {"commands": Limit(2, 3600.0)}, 3600.0, registry=registry)
    limiter.holds = holds
    for _ in range(2):
        await limiter.admit("commands", "flooder")
    began = time.perf_counter()
    for _ in range(5):  # as soon as each is answered, the next
        with pytest.raises(RateLimited):
            await limiter.admit("commands", "flooder")
    assert time.perf_counter() - began >= 4 * 0.05 * 0.95  # the first is answered at once
    assert registry.get_sample_value("gin_rate_limited_held_total", {"action": "commands"}) == 5
    await limiter.admit("commands", "someone-else")  # under its own limit: never held


async def test_refusals_past_the_schedule_are_held_a_random_while_not_in_lockstep() -> None:
    """A flood that arrived at once would be answered at once every ``max_s``, and send its
    next at once: past the schedule each is held between half ``max_s`` and ``max_s``."""
    asked: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        asked.append((low, high))
        return low + (high - low) * len(asked) / 4

    holds = Holds(30.0, 0.2, 100, clock=Clock(), uniform=uniform)
    assert await holds.hold("flooder") is True  # its first: at once, the next due in 30 s
    waits = [asyncio.create_task(holds.hold("flooder")) for _ in range(3)]
    await asyncio.sleep(0)
    assert asked == [(0.1, 0.2)] * 3
    assert holds.held == 3
    assert await asyncio.gather(*waits) == [True] * 3  # held 0.125, 0.15 and 0.175 s
