"""The open-file limit (issue 27, item 6): every service raises its soft RLIMIT_NOFILE to the
hard one at start, logs it, and /metrics reads the raised limit (``process_max_fds``); the
count ``FileBudget`` keeps, by the kernel's size of /proc/self/fd or by listing it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.infra.files import FD_DIR, FileBudget, counted_by_size
from shared.infra.settings import Settings
from tests.conftest import settings_of_their_own
from tests.e2e.processes import ROOT, free_port

# A child that lowers its own limits, then runs the module as ``python -m`` would: the limits
# a container runtime gives (containerd 2: soft 1,024), in small.
LIMITED = (
    "import resource, runpy, sys\n"
    "soft, hard, module = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
    "sys.argv = [module]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


class LimitedService:
    """``python -m <module>`` started with (soft, hard) limits on open files, its output (JSON
    log lines at info) in ``log``."""

    def __init__(
        self, module: str, settings: Settings, soft: int, hard: int, log: Path, **extra: str
    ) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIN_")}
        env.update(settings.to_env())
        env.update(
            GIN_HTTP_PORT=str(self.port), GIN_LOG_FORMAT="json", GIN_LOG_LEVEL="info", **extra
        )
        self.log = log
        self.output = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LIMITED, str(soft), str(hard), module],
            env=env,
            cwd=ROOT,
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{self.port}"

    async def ready(self, within_s: float = 60.0) -> None:
        """Wait until /readyz answers 200 (fails with the tail of its output)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        async with aiohttp.ClientSession() as session:
            while loop.time() < deadline and self.proc.poll() is None:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{self.base}/readyz") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise AssertionError(f"not ready (exit {self.proc.poll()}):\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def lines(self, event: str) -> list[dict[str, Any]]:
        """Its JSON log lines of this event."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    out.append(record)
        return out

    def open_files(self) -> int:
        """How many files the process has open now."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.output.close()


@contextlib.asynccontextmanager
async def limited(
    module: str, settings: Settings, soft: int, hard: int, log: Path, **extra: str
) -> AsyncIterator[LimitedService]:
    """A ``LimitedService``, ready; stopped on exit."""
    service = LimitedService(module, settings, soft, hard, log, **extra)
    try:
        await service.ready()
        yield service
    finally:
        service.stop()


async def metric(base: str, name: str, **labels: str) -> float:
    """One sample of a service's /metrics, with exactly those labels (none by default)."""
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as r:
        text = await r.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"no {name} in /metrics")


def in_a_child(code: str) -> Any:
    """Run ``code`` in a fresh interpreter (its limits are its own); the JSON it prints."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


RAISE_IN_A_CHILD = """
import json, resource
from structlog.testing import capture_logs
from shared.infra import files
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
with capture_logs() as logs:
    limit = files.raise_limit()
now = resource.getrlimit(resource.RLIMIT_NOFILE)
print(json.dumps({{"limit": list(limit), "now": list(now), "logs": logs}}))
"""


def test_raise_limit_lifts_the_soft_limit_to_the_hard_one_and_logs_it() -> None:
    got = in_a_child(RAISE_IN_A_CHILD.format(soft=256, hard=4096))
    assert got["limit"] == [256, 4096, 4096]
    assert got["now"] == [4096, 4096]
    line = {"event": "open_files_limit", "soft_before": 256, "soft": 4096, "hard": 4096}
    assert got["logs"] == [{**line, "log_level": "info"}]


def test_a_soft_limit_at_the_hard_one_is_left_as_it_is() -> None:
    got = in_a_child(RAISE_IN_A_CHILD.format(soft=3000, hard=3000))
    assert got["limit"] == [3000, 3000, 3000]
    assert got["now"] == [3000, 3000]
    assert [line["event"] for line in got["logs"]] == ["open_files_limit"]


@pytest.mark.skipif(not counted_by_size(), reason="this kernel gives /proc/self/fd no size")
def test_the_kernels_count_follows_the_files_opened_and_closed() -> None:
    budget = FileBudget(10_000, 0)
    assert budget.by_size
    before = budget.open_files()
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(300)]
    try:
        assert budget.open_files() == before + 300
    finally:
        for fd in opened:
            os.close(fd)
    assert budget.open_files() == before


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_listed_count_adds_what_was_admitted_since_until_it_lists_again(
    tmp_path: Path,
) -> None:
    """Where the kernel gives no size, the directory is listed once a ``relist_s``: the
    sockets admitted in between count as open, so a burst cannot pass the ceiling."""
    for n in range(5):
        (tmp_path / str(n)).touch()
    clock = Clock()
    budget = FileBudget(10, 2, fd_dir=tmp_path, by_size=False, relist_s=1.0, clock=clock)
    assert budget.ceiling == 8
    assert [budget.admits() for _ in range(5)] == [True, True, True, True, False]
    assert budget.open_files() == 5 + 4
    (tmp_path / "0").unlink()  # closed: not seen until the next listing
    assert not budget.admits()
    clock.now = 1.0
    assert budget.open_files() == 4
    assert [budget.admits() for _ in range(5)] == [True, True, True, True, True]
    assert not budget.admits()


def test_the_budget_logs_when_it_starts_and_stops_refusing(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    budget = FileBudget(4, 1, fd_dir=tmp_path, by_size=False, relist_s=0.0)
    with capture_logs() as logs:
        assert budget.admits()
        for n in range(4):
            (tmp_path / str(n)).touch()
        assert not budget.admits()
        assert not budget.admits()
        (tmp_path / "0").unlink()
        assert budget.admits()
    assert [(line["event"], line["open_files"]) for line in logs] == [
        ("open_files_past_ceiling", 4),
        ("open_files_under_ceiling", 3),
    ]


def test_the_process_count_is_the_directorys() -> None:
    """Either way of counting counts this process's files (the listing's own included)."""
    by_list = FileBudget(10_000, 0, by_size=False).open_files()
    assert abs(by_list - len(os.listdir(FD_DIR))) <= 1


# --- every service, started as the runtime starts it ----------------------------------------

SERVICES = ("services.table", "services.table.relay", "services.chat", "services.timers")


@pytest.fixture(scope="module")
def own_settings(settings: Settings) -> Iterator[Settings]:
    """A database and a broker prefix of their own: these services' relays and consumers
    must not take the other tests' rows and messages."""
    with settings_of_their_own(settings, "files") as own:
        yield own


@pytest.mark.parametrize("module", [*SERVICES, "services.bots"])
async def test_every_service_raises_its_soft_limit_at_start(
    module: str, own_settings: Settings, tmp_path: Path
) -> None:
    async with limited(module, own_settings, 256, 4096, tmp_path / "out.log") as service:
        assert await metric(service.base, "process_max_fds") == 4096, service.tail()
        lines = service.lines("open_files_limit")
    assert [(x["soft_before"], x["soft"], x["hard"]) for x in lines] == [(256, 4096, 4096)]


def test_process_metrics_are_prometheus_clients_without_listing_the_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The services' process collector exports what prometheus-client's does, the same names
    and help, with the open files counted by the directory's size, not by a listing whose
    cost grows with every socket (ProcessCollector lists /proc/self/fd at every scrape)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.process_collector import ProcessCollector

    from shared.infra.files import counted_by_size
    from shared.infra.ops import ProcessMetrics

    ours, theirs = CollectorRegistry(), CollectorRegistry()
    ProcessMetrics(ours)
    ProcessCollector(registry=theirs)

    def samples(registry: CollectorRegistry) -> dict[str, float]:
        lines = generate_latest(registry).decode().splitlines()
        assert lines
        return {n: float(v) for n, v in (ln.split() for ln in lines if not ln.startswith("#"))}

    def helps(registry: CollectorRegistry) -> list[str]:
        return [ln for ln in generate_latest(registry).decode().splitlines() if ln[:1] == "#"]

    mine, upstream = samples(ours), samples(theirs)
    assert helps(ours) == helps(theirs)
    assert mine.keys() == upstream.keys()
    # The listing holds the directory open while it counts: one more than there is.
    assert upstream["process_open_fds"] - 1 <= mine["process_open_fds"]
    assert mine["process_open_fds"] <= upstream["process_open_fds"]
    assert mine["process_max_fds"] == upstream["process_max_fds"]
    assert mine["process_resident_memory_bytes"] > 0
    if counted_by_size():

        def no_listing(path: object) -> list[str]:
            raise AssertionError(f"listed {path}")

        monkeypatch.setattr("os.listdir", no_listing)
        assert samples(ours)["process_open_fds"] > 0
