"""The process's memory: whether it may take one more long-lived socket.

A table replica's sockets are what grow its memory, and past its container's limit the kernel
kills it: every player on it drops at once. ``MemoryBudget`` admits a new socket only while
the memory in use is under a share (``GIN_MEMORY_FULL_SHARE``) of the limit, so the replica
refuses the next socket (1013, reconnect in a while: another replica, or this one later)
rather than be killed. The limit is ``GIN_MEMORY_LIMIT_BYTES`` when set, else the container's
(cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``). Against the container's limit the
use is the container's (``memory.current``: the kernel's socket buffers count too, as the
kernel counts them when it kills); against a limit set here, the process's resident memory.
With no limit anywhere every socket is admitted (``GIN_MAX_SOCKETS`` still bounds them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger()
CGROUP = Path("/sys/fs/cgroup")  # the container's own cgroup (a private cgroup namespace)
V2_LIMIT, V2_USE = "memory.max", "memory.current"
V1_LIMIT, V1_USE = "memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"
UNLIMITED_V1 = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63
STATM = "/proc/self/statm"  # sizes in pages: total, resident, ...
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident memory."""
    with open(STATM, "rb") as statm:
        return int(statm.read().split()[1]) * PAGE


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def container_limit(root: Path = CGROUP) -> tuple[int, Path] | None:
    """The container's memory limit and the file that gives its use, or None if unlimited
    (or not in a cgroup with a memory controller)."""
    for limit_name, use_name in ((V2_LIMIT, V2_USE), (V1_LIMIT, V1_USE)):
        if not (root / limit_name).exists():
            continue
        limit = _read_int(root / limit_name)
        if limit is None or limit >= UNLIMITED_V1:
            return None
        return limit, root / use_name
    return None


class MemoryBudget:
    """Whether this process may take one more long-lived socket: only while ``used()`` is
    under ``share`` of ``limit`` (the ``ceiling``); None for a limit admits every one."""

    def __init__(self, limit: int | None, share: float, used: Callable[[], int]) -> None:
        self.limit = limit
        self.ceiling = None if limit is None else int(limit * share)
        self.used = used
        self.refusing = False

    @classmethod
    def of_process(cls, limit_bytes: int, share: float, root: Path = CGROUP) -> MemoryBudget:
        """Under ``limit_bytes`` of resident memory if set (non-zero), else under the
        container's limit, measured as the container measures it."""
        if limit_bytes > 0:
            return cls(limit_bytes, share, resident_bytes)
        found = container_limit(root)
        if found is None:
            return cls(None, share, resident_bytes)
        limit, use = found
        return cls(limit, share, lambda: _read_int(use) or 0)

    def admits(self) -> bool:
        """True if one more socket may stay open. The first refusal after an admission, and
        the reverse, log one line each."""
        if self.ceiling is None:
            return True
        used = self.used()
        full = used >= self.ceiling
        if full != self.refusing:
            self.refusing = full
            event = "memory_past_ceiling" if full else "memory_under_ceiling"
            log.warning(event, used_bytes=used, ceiling_bytes=self.ceiling, limit_bytes=self.limit)
        return not full
