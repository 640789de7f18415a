"""Per-identity rate limits, valid across a service's replicas, with no round trip per check.

Fixed windows: an action allows ``per`` requests in each window of ``window_s`` seconds,
counted from the epoch, so every replica's windows are the same. ``check`` touches only this
process's memory (a few dict lookups): a flood is refused as cheaply as it arrives. Every
``sync_s`` (``run``) the replica adds the counts it took since its last sync to the shared,
unlogged ``rate_limits`` table in one statement, which answers the new totals of those keys
and the totals of every key of the current windows that has reached half its limit, so a
replica learns of an identity it has not counted yet that the others pushed near or past
the limit. A check refuses when the last total learnt plus the counts not synced yet reaches
the limit; a refused request is not counted.

A refusal is not answered at once (``admit``): an identity past its limit gets its refusals
one per ``Holds.interval_s``, each held up to ``max_s``, and longer once the identity has
more than ``crowd`` held at once. A client that ignores Retry-After and asks again as soon as
it is answered is so slowed, and what it costs the replica falls with it (a held request
costs a socket and a timer, no CPU; an answered one the CPU of its HTTP): on C connections
it is answered about 1 / interval_s + min(C, crowd) / (0.75 max_s) times a second, however
many connections it opens. Holding is bounded, over all identities and per identity; past
those bounds a refusal is answered at once, as before holding.

How far past its limit a window can go: a count reaches the table at its replica's next
sync and another replica at that replica's next sync, so a replica may not know what the
others accepted in the last two sync intervals (plus the two statements' time); a replica
that has not counted an identity below half its limit learns its total at its own first
sync after its first count. A window therefore accepts at most ``per`` plus what the
identity got accepted in those moments by replicas that had not heard yet, after which every
replica refuses it until the window ends. An identity that keeps to one replica is held
exactly. At the defaults (0.2 s) a flood of 500 commands/s spread over several replicas gets
at most some 200 past its limit, once per window. While the database is down each replica
holds the limit on its own counts (so at most ``per`` per replica) and sends them once it
is back. A sync whose answer is lost after its commit (a timeout) sends its counts again:
that error errs on the strict side.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from itertools import islice

import asyncpg
import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.infra.settings import Settings

log = structlog.get_logger()
MAX_ENTRIES = 100_000  # identities counted at once, over all actions and windows
EVICT_SHARE = 10  # a full table drops a tenth of its entries at once (amortized O(1))
PRUNE_EVERY_S = 60.0  # ended windows leave the table this often
SYNC_TIMEOUT_S = 5.0  # a sync that neither answers nor fails (a partition) gives up
MAX_BACKOFF_S = 2.0
# Identities kept as they are in the table and in memory; any other (long, non-ASCII, with a
# NUL or a lone surrogate, which PostgreSQL's text or its index would refuse and so poison
# every sync) is kept as a digest, marked by a first character no plain identity has.
PLAIN_MAX = 128
DIGEST_MARK = "~"

# Add the counts, answer their totals and those of the keys shared with every replica, and
# (when $8) delete the windows that ended; one round trip. Rows come sorted by key, so two
# replicas' statements lock the rows they share in the same order (no deadlock). The shared
# keys are read from the snapshot before the insert: a key of both parts is taken at its
# larger count.
_SYNC = """
WITH counted AS (
    INSERT INTO rate_limits AS r (action, identity, window_no, ends_at, count, shared_from)
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::bigint[], $4::float8[], $5::bigint[], $6::bigint[])
    ON CONFLICT (action, identity, window_no) DO UPDATE SET count = r.count + EXCLUDED.count
    RETURNING r.action, r.identity, r.window_no, r.ends_at, r.count
), pruned AS (
    DELETE FROM rate_limits WHERE $8 AND ends_at <= $7
)
SELECT action, identity, window_no, ends_at, count FROM counted
UNION ALL
SELECT action, identity, window_no, ends_at, count FROM rate_limits
WHERE count >= shared_from AND ends_at > $7
"""


class Limit(msgspec.Struct, frozen=True):
    """``per`` requests in each window of ``window_s`` seconds."""

    per: int
    window_s: float


class RateLimited(Exception):
    """An identity used up its ``action`` limit for this window; ``retry_after_s`` (whole
    seconds, at least 1) is when the window ends."""

    def __init__(self, action: str, retry_after_s: int) -> None:
        super().__init__(f"too many {action}: retry in {retry_after_s} s")
        self.action = action
        self.retry_after_s = retry_after_s


# How much longer than ``max_s`` a crowded identity's refusal may be held, at the most (two
# minutes at the default 5 s: a client's or a proxy's timeout is longer).
MAX_STRETCH = 24.0


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class Holds:
    """Refusals held back. Each identity's refusals are answered one per ``interval_s``; one
    whose turn is more than ``max_s`` away is answered after between half ``max_s`` and
    ``max_s``, at random (so a flood that arrived at once is not answered at once, and sent
    again at once, in lockstep every ``max_s``), stretched by n / ``crowd`` while the identity
    has n > ``crowd`` held (``MAX_STRETCH`` at most): a client that opens more connections
    gets no more answers for them (a flood answered in full on many connections raised the
    seated players' tail; one does not hold many requests to play). At most ``max_held`` are
    held at once, ``max_held_per_identity`` of one identity (all of them, unless told); past
    those a refusal is answered at once. ``release`` (at shutdown) answers them all."""

    def __init__(
        self,
        interval_s: float,
        max_s: float,
        max_held: int,
        max_held_per_identity: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        uniform: Callable[[float, float], float] = random.uniform,
        crowd: int = 20,
    ) -> None:
        per_identity = max_held if max_held_per_identity is None else max_held_per_identity
        if min(interval_s, max_s, max_held, per_identity) < 0 or crowd < 1:
            raise ValueError("interval_s, max_s and the bounds must not be negative, crowd >= 1")
        self.interval_s = interval_s
        self.max_s = max_s
        self.max_held = max_held
        self.max_held_per_identity = per_identity
        self.crowd = crowd
        self.clock = clock
        self.uniform = uniform
        self._held_by: dict[str, int] = {}
        self._next: dict[str, float] = {}  # when each identity's next refusal may be answered
        self._released = False
        self._waiting: set[asyncio.Future[None]] = set()  # one per held refusal
        # The long holds whose client may leave, asked all at once every max_s by one timer:
        # a timer of its own per hold, woken every max_s, costs CPU and objects per hold, in
        # lockstep for holds that began together (a flood's, all at once).
        self._watched: dict[asyncio.Future[None], Callable[[], bool]] = {}
        self._sweeping: asyncio.TimerHandle | None = None

    async def hold(self, key: str, gone: Callable[[], bool] | None = None) -> bool:
        """Wait until ``key``'s refusal may be answered (at once for its first); False when
        answered at once because a bound is reached or holds were released. ``gone`` tells
        whether the client has gone away: a hold longer than ``max_s`` is asked within every
        ``max_s`` and ends once it is (a client that left must not keep a hold for minutes: a
        flooder that reconnected would fill the holds with its own ghosts)."""
        if self._released:
            return False
        now = self.clock()
        at = max(now, self._next.get(key, now))
        if at - now > self.max_s:  # past the schedule's reach: held about as long as any
            crowded = (self._held_by.get(key, 0) + 1) / self.crowd
            wait = self.uniform(self.max_s / 2, self.max_s) * min(max(1.0, crowded), MAX_STRETCH)
        else:
            wait = at - now
            if wait <= 0 or self._has_room(key):
                self._schedule(key, at + self.interval_s, now)
        if wait <= 0:
            return True
        if not self._has_room(key):
            return False
        self._held_by[key] = self._held_by.get(key, 0) + 1
        loop = asyncio.get_running_loop()  # the schedule's clock may be a test's
        done: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(wait, _settle, done)
        self._waiting.add(done)
        if gone is not None and wait > self.max_s:
            self._watched[done] = gone
            if self._sweeping is None:
                self._sweeping = loop.call_later(self.max_s, self._sweep)
        try:
            await done
        finally:
            timer.cancel()
            self._waiting.discard(done)
            self._watched.pop(done, None)
            others = self._held_by.pop(key) - 1
            if others:
                self._held_by[key] = others
        return True

    @property
    def held(self) -> int:
        """How many refusals are held now."""
        return len(self._waiting)

    def release(self) -> None:
        """Answer every held refusal now, and hold no more (the replica is stopping)."""
        self._released = True
        for done in self._waiting:
            _settle(done)
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None

    def _sweep(self) -> None:
        """End the watched holds whose client has gone; again in ``max_s`` while any is
        watched."""
        self._sweeping = None
        for done, gone in self._watched.items():
            if gone():
                _settle(done)
        if self._watched and not self._released:
            loop = asyncio.get_running_loop()
            self._sweeping = loop.call_later(self.max_s, self._sweep)

    def _has_room(self, key: str) -> bool:
        by_key = self._held_by.get(key, 0)
        return self.held < self.max_held and by_key < self.max_held_per_identity

    def _schedule(self, key: str, next_at: float, now: float) -> None:
        if len(self._next) > 2 * self.max_held + 1024:  # identities that have gone quiet
            self._next = {k: t for k, t in self._next.items() if t > now}
        self._next[key] = next_at


class _Window:
    """One action's counts in one window, by identity."""

    __slots__ = ("action", "counts", "ends_at", "no", "pending", "per", "shared_from", "starts_at")

    def __init__(self, action: str, no: int, limit: Limit) -> None:
        self.action = action
        self.no = no
        self.per = limit.per
        self.starts_at = no * limit.window_s
        self.ends_at = (no + 1) * limit.window_s
        self.shared_from = max(1, (limit.per + 1) // 2)
        # The total learnt at the last sync plus this replica's counts since; never below 1.
        self.counts: dict[str, int] = {}
        self.pending: dict[str, int] = {}  # this replica's counts not sent yet


class RateLimiter:
    """Per-identity limits of some actions, shared by the replicas through the database."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        limits: Mapping[str, Limit],
        sync_s: float,
        clock: Callable[[], float] = time.time,
        *,
        registry: CollectorRegistry | None = None,
        max_entries: int = MAX_ENTRIES,
        holds: Holds | None = None,
    ) -> None:
        """``clock`` is wall time (the replicas' windows must agree); ``registry`` gets the
        refusals by action; at most ``max_entries`` identities are counted at once; ``holds``
        holds back refusals in ``admit`` (none held without it)."""
        if sync_s <= 0 or max_entries < 1 or any(lim.window_s <= 0 for lim in limits.values()):
            raise ValueError("sync_s, max_entries and every window_s must be positive")
        self.pool = pool
        self.limits = dict(limits)
        self.sync_s = sync_s
        self.clock = clock
        self.max_entries = max_entries
        self.holds = Holds(0.0, 0.0, 0) if holds is None else holds
        self._windows: dict[tuple[str, int], _Window] = {}  # oldest first
        self._current: dict[str, _Window] = {}  # each action's window last checked
        self._entries = 0
        self._prune_at = clock()  # the first sync prunes what an earlier run left
        registry = CollectorRegistry() if registry is None else registry
        refused = Counter(
            "gin_rate_limited", "Requests refused by a rate limit", ["action"], registry=registry
        )
        self._refused = {action: refused.labels(action) for action in self.limits}
        self._held = Counter(
            "gin_rate_limited_held",
            "Refusals answered on their identity's hold schedule (the rest were answered at once)",
            ["action"],
            registry=registry,
        )
        Gauge(
            "gin_rate_limited_holding",
            "Refusals held back right now",
            registry=registry,
        ).set_function(lambda: self.holds.held)
        self._sync_failures = Counter(
            "gin_rate_limit_sync_failures",
            "Rate limit syncs with the database that failed",
            registry=registry,
        )

    @classmethod
    def from_settings(
        cls, pool: asyncpg.Pool, settings: Settings, *, registry: CollectorRegistry | None = None
    ) -> RateLimiter:
        """The limits of commands, joins (and bot seatings), table creation, preference
        changes, WebSocket connections, lists of one's tables and refused commands."""
        limits = {
            "commands": Limit(settings.rate_commands, settings.rate_commands_window_s),
            "joins": Limit(settings.rate_joins, settings.rate_joins_window_s),
            "tables": Limit(settings.rate_tables, settings.rate_tables_window_s),
            "preferences": Limit(settings.rate_preferences, settings.rate_preferences_window_s),
            "sockets": Limit(settings.rate_sockets, settings.rate_sockets_window_s),
            "lists": Limit(settings.rate_lists, settings.rate_lists_window_s),
            "refusals": Limit(settings.rate_refusals, settings.rate_refusals_window_s),
        }
        holds = Holds(
            settings.rate_hold_interval_s,
            settings.rate_hold_max_s,
            settings.rate_holds_max,
            crowd=settings.rate_hold_crowd,
        )
        return cls(pool, limits, settings.rate_sync_s, registry=registry, holds=holds)

    @property
    def entries(self) -> int:
        """How many identities this replica counts, over all actions and windows."""
        return self._entries

    def check(self, action: str, identity: str) -> None:
        """Count one ``action`` of ``identity``, or raise RateLimited if its window's limit
        is reached (a KeyError for an action without a limit)."""
        now = self.clock()
        window = self._current.get(action)
        if window is None or not window.starts_at <= now < window.ends_at:
            window = self._window_at(action, now)
        key = _key(identity)
        count = window.counts.get(key, 0)
        if count >= window.per:
            self._refused[action].inc()
            raise RateLimited(action, max(1, math.ceil(window.ends_at - now)))
        if not count:
            self._admit()
        window.counts[key] = count + 1
        window.pending[key] = window.pending.get(key, 0) + 1

    async def admit(
        self, action: str, identity: str, gone: Callable[[], bool] | None = None
    ) -> None:
        """``check``, but a refusal is held back first (``Holds``; ``gone``: whether the
        client has left): a client that asks again as soon as it is refused is answered no
        faster than the holds allow."""
        try:
            self.check(action, identity)
        except RateLimited:
            if await self.holds.hold(_key(identity), gone):
                self._held.labels(action).inc()
            raise

    async def sync(self) -> None:
        """Send this replica's counts since the last sync and learn the totals, in one
        statement; counts that could not be sent are sent with the next sync."""
        now = self.clock()
        self._drop_ended(now)
        sent = [(window, window.pending) for window in self._windows.values() if window.pending]
        for window, _ in sent:
            window.pending = {}
        rows = sorted(
            (w.action, key, w.no, w.ends_at, n, w.shared_from)
            for w, pending in sent
            for key, n in pending.items()
        )
        columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * 6
        prune = now >= self._prune_at
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_S), self.pool.acquire() as conn:
                found = await conn.fetch(_SYNC, *columns, now, prune)
        except BaseException:
            self._unsend(sent)
            raise
        if prune:
            self._prune_at = now + PRUNE_EVERY_S
        self._learn(found, self.clock())

    async def run(self) -> None:
        """Sync every ``sync_s`` until cancelled; through database outages (logged, backing
        off), checks go on with this replica's own counts."""
        loop = asyncio.get_running_loop()
        backoff = self.sync_s
        while True:
            began = loop.time()
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._sync_failures.inc()
                log.warning("rate_limit_sync_failed", error=repr(exc), retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max(MAX_BACKOFF_S, self.sync_s))
                continue
            backoff = self.sync_s
            await asyncio.sleep(max(0.0, began + self.sync_s - loop.time()))

    def _window_at(self, action: str, now: float) -> _Window:
        """The window of ``action`` at ``now``, opened if new (ended ones are dropped then)."""
        limit = self.limits[action]
        no = math.floor(now / limit.window_s)
        window = self._windows.get((action, no))
        if window is None:
            self._drop_ended(now)
            window = self._windows[action, no] = _Window(action, no, limit)
        self._current[action] = window
        return window

    def _drop_ended(self, now: float) -> None:
        for key, window in list(self._windows.items()):
            if window.ends_at <= now:
                del self._windows[key]
                self._entries -= len(window.counts)
                if self._current.get(window.action) is window:
                    del self._current[window.action]

    def _admit(self) -> None:
        """Room for one more identity."""
        if self._entries >= self.max_entries:
            self._evict()
        self._entries += 1

    def _evict(self) -> None:
        """Forget a tenth of the identities, of the oldest windows first, those already sent
        before the others (whose counts are then lost). The table keeps the totals: one
        forgotten is refused again once its next count is synced."""
        goal = max(1, self.max_entries // EVICT_SHARE)
        dropped = unsent = 0
        for spare_unsent in (True, False):
            for window in self._windows.values():
                if dropped >= goal:
                    break
                candidates = (
                    key for key in window.counts if not (spare_unsent and key in window.pending)
                )
                victims = list(islice(candidates, goal - dropped))
                for key in victims:
                    del window.counts[key]
                    unsent += window.pending.pop(key, 0)
                dropped += len(victims)
        self._entries -= dropped
        log.warning("rate_limit_entries_evicted", dropped=dropped, unsent=unsent)

    def _unsend(self, sent: Iterable[tuple[_Window, dict[str, int]]]) -> None:
        """Put back counts a failed sync took, for the next sync."""
        for window, pending in sent:
            if self._windows.get((window.action, window.no)) is not window:
                continue  # ended meanwhile
            for key, n in pending.items():
                if key in window.counts:  # not forgotten meanwhile
                    window.pending[key] = window.pending.get(key, 0) + n

    def _learn(self, rows: Iterable[asyncpg.Record], now: float) -> None:
        """Take the totals a sync answered (counts never go down within a window)."""
        for action, key, no, ends_at, total in rows:
            window = self._windows.get((action, no))
            if window is None:
                limit = self.limits.get(action)
                if limit is None or ends_at <= now:
                    continue
                window = _Window(action, no, limit)
            if ends_at != window.ends_at:  # both (no + 1) * window_s: equal when the same
                continue  # a replica with another window length for the action (a deploy)
            self._windows.setdefault((action, no), window)
            known = window.counts.get(key)
            if known is None:
                if total < window.shared_from:
                    continue  # one this replica forgot: not worth the room
                self._admit()
                window.counts[key] = total
            else:
                window.counts[key] = max(known, total + window.pending.get(key, 0))


def _key(identity: str) -> str:
    """The identity as counted: itself when short, printable ASCII; else a digest."""
    if (
        len(identity) <= PLAIN_MAX
        and identity.isascii()
        and identity.isprintable()
        and not identity.startswith(DIGEST_MARK)
    ):
        return identity
    digest = hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=16)
    return DIGEST_MARK + digest.hexdigest()
