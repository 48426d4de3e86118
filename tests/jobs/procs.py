"""Worker processes for the crash, freeze and fault tests."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``tests/jobs/worker_proc.py`` in a child process (see there for the modes)."""

    def __init__(self, directory: Path, queue: str, mode: str, log: Path, concurrency: int = 1) -> None:
        self.args = [str(directory), queue, mode, str(log), str(concurrency)]
        self.errors = directory.parent / f"worker-{queue}-{mode}.err"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, timeout: float = 20.0) -> WorkerProcess:
        with self.errors.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.jobs.worker_proc", *self.args],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if line.strip() != b"ready":
            raise RuntimeError(f"worker did not start: {self.errors.read_text()[-2000:]}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    async def wait(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            await self.wait()

    async def stop(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                await self.wait(10)
            except TimeoutError:
                await self.kill()


def starts(log: Path) -> list[tuple[str, int, int, int]]:
    """The ``start`` lines of a worker log: (job id, attempt, fence, pid)."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "start":
            out.append((parts[1], int(parts[2]), int(parts[3]), int(parts[4])))
    return out
