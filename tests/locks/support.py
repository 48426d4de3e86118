"""Helpers of the lock tests: actor processes (``tests/locks/actor.py``), a second client, timing, polling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import tinystore

ROOT = Path(__file__).resolve().parents[2]


class Actor:
    """An actor process: ``events`` collects what it printed, one dict a line."""

    def __init__(self, **cfg: Any) -> None:
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.events: list[dict[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None
        self._new = asyncio.Event()

    async def start(self) -> Actor:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.locks.actor",
            json.dumps(self.cfg),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.events.append(json.loads(line))
            self._new.set()
        self._new.set()

    async def event(self, name: str, timeout: float = 20.0) -> dict[str, Any]:
        """The first event called ``name`` (waiting for it)."""
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e.get("event") == name:
                    return e
            if self._reader is not None and self._reader.done():
                raise AssertionError(f"the actor ended without {name!r}: {self.events}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {name!r} from the actor within {timeout:g}s: {self.events}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    def send(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)

    async def wait(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        if self._reader is not None:
            await self._reader
        return code

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader


@contextlib.asynccontextmanager
async def actor(**cfg: Any) -> AsyncIterator[Actor]:
    a = await Actor(**cfg).start()
    try:
        yield a
    finally:
        await a.stop()


@contextlib.asynccontextmanager
async def other_client(store: tinystore.Store) -> AsyncIterator[tinystore.Store]:
    """A second client of the same store over its socket (beside an embedded store too: its leases follow
    the ttl rules)."""
    assert store.directory is not None
    other = await tinystore.open(store.directory)
    try:
        yield other
    finally:
        await other.close()


async def eventually(pred: Callable[[], bool], timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g}s")
        await asyncio.sleep(0.005)


def holders(status: dict[str, Any], lock: str, key: str) -> tuple[int, int]:
    """(leases, waiters) of ``key`` of ``lock`` in ``store.status()``."""
    for row in status["locks"]["keys"]:
        if row["lock"] == lock and row["key"] == key:
            return int(row["held"]), int(row["waiters"])
    return 0, 0
