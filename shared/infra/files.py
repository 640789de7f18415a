"""The process's open files: its limit raised at start, and a budget that keeps some free.

A container starts with the soft ``RLIMIT_NOFILE`` its runtime gives it, and containerd 2 no
longer raises its own (its unit dropped ``LimitNOFILE``): its containers start at systemd's
soft 1,024, far under the sockets a table replica holds, with a hard limit far above it
(524,288). Any process may raise its soft limit up to its hard one, without privilege, so
every service does at start (``raise_limit``, from ``service.main``).

Past the limit every accept, connect and open fails with EMFILE. Under uvloop, libuv then
accepts every pending connection and closes it at once: a plain request is reset, unanswered
(the listener itself survives, and answers again once files are free); the pool cannot make
a connection, nor the broker client reconnect. ``FileBudget`` keeps a reserve free for those:
a service that holds many long-lived sockets admits a new one only while its open files stay
under its limit less the reserve (``GIN_FILES_RESERVE``).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import structlog

log = structlog.get_logger()
FD_DIR = Path("/proc/self/fd")  # one entry per open file of this process
NR_OPEN = Path("/proc/sys/fs/nr_open")  # the kernel's cap on any process's limit
NR_OPEN_DEFAULT = 1 << 20  # Linux's default fs.nr_open, when it cannot be read
# Never raised past this (Linux's default fs.nr_open): a hard limit of systemd's "infinity" is
# fs.nr_open, which systemd sets to 2**30, and what walks every possible descriptor (a
# child's close_fds without /proc, say) would walk a billion. A million sockets would take a
# table replica more memory than it is ever given (a socket's cost: deploy/README.md, "How
# many matches"), so this cap binds no replica.
SOFT_CAP = 1 << 20
UNLIMITED = resource.RLIM_INFINITY


class FileLimit(NamedTuple):
    """The soft limit on open files before and after ``raise_limit``, and the hard one
    (``UNLIMITED``: none)."""

    before: int
    soft: int
    hard: int


def soft_target(hard: int, nr_open: int) -> int:
    """The soft limit to raise to: the hard one, or the kernel's cap when it is unlimited
    (a soft limit above ``fs.nr_open`` is refused); ``SOFT_CAP`` at most.

    >>> soft_target(524_288, 1_048_576)
    524288
    >>> soft_target(UNLIMITED, 1_048_576)
    1048576
    >>> soft_target(1_073_741_816, 1_073_741_816)  # systemd's "infinity"
    1048576
    """
    return min(nr_open if hard == UNLIMITED else hard, SOFT_CAP)


def _nr_open() -> int:
    try:
        return int(NR_OPEN.read_text())
    except (OSError, ValueError):
        return NR_OPEN_DEFAULT


def raise_limit() -> FileLimit:
    """Raise this process's soft limit on open files to its hard limit (``soft_target``) and
    log one line with both, before and after (a refusal of the kernel leaves it as it was,
    logged)."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before
    target = soft_target(hard, _nr_open())
    if before != UNLIMITED and before < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("open_files_limit_not_raised", soft=before, hard=hard, error=str(exc))
    log.info("open_files_limit", soft_before=before, soft=soft, hard=hard)
    return FileLimit(before, soft, hard)


def soft_limit() -> int:
    """This process's soft limit on open files (the kernel's cap when it is unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _nr_open() if soft == UNLIMITED else soft


def counted_by_size(fd_dir: Path = FD_DIR) -> bool:
    """Whether the kernel gives the count of open files as the size of ``/proc/self/fd``
    (Linux 6.2 on: a bitmap's weight, microseconds however many are open); else the
    directory must be listed, whose cost grows with every file open."""
    try:
        return os.stat(fd_dir).st_size > 0
    except OSError:
        return False


class FileBudget:
    """Whether this process may take one more long-lived socket: only while its open files
    are at most ``limit - reserve`` (the ``ceiling``), so the reserve stays free for its
    pool, its broker, its probes and plain requests.

    The count is the kernel's, exact at each ``admits`` where ``/proc/self/fd`` has a size;
    elsewhere the directory is listed at most once every ``relist_s`` and each socket
    admitted since is added to that count (those closed since are not taken off: the count
    is never under the truth)."""

    def __init__(
        self,
        limit: int,
        reserve: int,
        *,
        fd_dir: Path = FD_DIR,
        by_size: bool | None = None,
        relist_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.reserve = reserve
        self.ceiling = limit - reserve
        self.fd_dir = fd_dir
        self.by_size = counted_by_size(fd_dir) if by_size is None else by_size
        self.relist_s = relist_s
        self.clock = clock
        self.listed = 0
        self.listed_at = -float("inf")
        self.admitted_since = 0
        self.refusing = False

    @classmethod
    def of_process(cls, reserve: int) -> FileBudget:
        """The budget of this process under its soft limit as it is now."""
        return cls(soft_limit(), reserve)

    def open_files(self) -> int:
        """How many files the process has open (by the fallback: at least that many)."""
        if self.by_size:
            return os.stat(self.fd_dir).st_size
        now = self.clock()
        if now - self.listed_at >= self.relist_s:
            self.listed = len(os.listdir(self.fd_dir))
            self.listed_at = now
            self.admitted_since = 0
        return self.listed + self.admitted_since

    def admits(self) -> bool:
        """True if one more socket may stay open (the one asking is open, and counted).
        The first refusal after an admission, and the reverse, log one line each."""
        count = self.open_files()
        full = count > self.ceiling
        if full != self.refusing:
            self.refusing = full
            event = "open_files_past_ceiling" if full else "open_files_under_ceiling"
            log.warning(event, open_files=count, ceiling=self.ceiling, limit=self.limit)
        if full:
            return False
        if not self.by_size:
            self.admitted_since += 1
        return True
