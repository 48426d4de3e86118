"""``tinystore demo`` in a child process, for tests: its addresses, and a clean stop (the sidecar too)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from ..helpers import stop_sidecar

URL = re.compile(r"http://127\.0\.0\.1:\d+")


class Demo:
    def __init__(self, proc: asyncio.subprocess.Process, urls: list[str], output: list[str]) -> None:
        self.proc = proc
        self.urls = urls
        self.output = output

    async def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, as Ctrl-C would; the exit status (after a SIGKILL if it did not stop in time)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(timeout):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
                raise AssertionError(f"the demo did not stop within {timeout}s of SIGTERM") from None
        assert self.proc.returncode is not None
        return self.proc.returncode


@contextlib.asynccontextmanager
async def run_demo(directory: Path, *args: str, urls: int = 1, stderr: Path | None = None) -> AsyncIterator[Demo]:
    """Start ``tinystore demo DIRECTORY --port 0 ARGS``; yields once it printed ``urls`` addresses. ``stderr``: a
    file that gets what it writes there (else it goes to the test's)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with contextlib.ExitStack() as files:
        err = files.enter_context(stderr.open("wb")) if stderr is not None else None
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tinystore", "demo", str(directory), "--port", "0", *args,
            stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, stderr=err, env=env,
        )  # fmt: skip
    assert proc.stdout is not None
    found: list[str] = []
    output: list[str] = []
    demo = Demo(proc, found, output)
    drain: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(60):
            while len(found) < urls:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    raise AssertionError(f"the demo exited ({await proc.wait()}) before it served: {output}")
                output.append(line)
                found += URL.findall(line)

        async def read_rest() -> None:
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                output.append(line.decode())

        drain = asyncio.ensure_future(read_rest())
        yield demo
    finally:
        try:
            await demo.stop()
        finally:
            if drain is not None:
                drain.cancel()
                with contextlib.suppress(BaseException):
                    await drain
            await stop_sidecar(directory)  # a --web-processes demo's sidecar (none for an embedded one)
