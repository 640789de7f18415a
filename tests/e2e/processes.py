"""Services as real processes, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from scripts.gin_servers.common import free_port, free_ports
from shared.infra.settings import Settings

ROOT = Path(__file__).resolve().parent.parent.parent
__all__ = ["ROOT", "Service", "all_ready", "free_port", "free_ports", "output_to"]


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """A child started inside writes its stdout and stderr to ``path`` (it inherits fds)."""
    with path.open("ab") as log:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


class Service:
    """``python -m services.<name>`` with the given settings, on ``port`` or a free one."""

    def __init__(
        self,
        module: str,
        settings: Settings,
        *,
        port: int | None = None,
        log_to: Path | None = None,
        **extra: str,
    ) -> None:
        self.port = port or free_port()
        env = {**os.environ, **settings.to_env()}
        env.update({"GIN_HTTP_PORT": str(self.port), "GIN_LOG_LEVEL": "warning", **extra})
        self.output = None if log_to is None else log_to.open("wb")  # stdout and stderr
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            env=env,
            cwd=ROOT,
            stdout=self.output,
            stderr=None if self.output is None else subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{self.port}"

    async def ready(self, within_s: float = 30.0) -> None:
        """Wait until /readyz answers 200."""
        deadline = asyncio.get_running_loop().time() + within_s
        async with aiohttp.ClientSession() as session:
            while asyncio.get_running_loop().time() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the service exited with {self.proc.returncode}")
                try:
                    async with session.get(f"{self.base}/readyz") as r:
                        ready = r.status == 200
                    if ready and self.proc.poll() is None:
                        return  # (a process that could not bind exits: the answer was not its)
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError("the service did not become ready")

    def terminate(self) -> None:
        """SIGTERM: the service drains and exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """Terminate and wait; kill if it hangs."""
        self.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.output is not None:
            self.output.close()


async def all_ready(services: dict[str, Service], logs: dict[str, Path], within_s: float) -> None:
    """Wait for every service; one that exits or never gets ready fails the test with the
    tail of its log."""
    for name, service in services.items():
        try:
            await service.ready(within_s=within_s)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{name}: {exc}\n{logs[name].read_text()[-3000:]}") from exc
