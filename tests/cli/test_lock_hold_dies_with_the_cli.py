"""``tinystore lock DIR hold``: the command never outlives the CLI, even when the CLI is killed with SIGKILL
(else a second ``hold`` could run it while the first still does)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import open_store
from .support import popen_cli, running

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")


async def _read_pid(pidfile: Path, cli: subprocess.Popen[bytes], within: float = 8.0) -> int:
    deadline = time.monotonic() + within
    while True:
        text = pidfile.read_text() if pidfile.exists() else ""
        if text.endswith("\n"):
            return int(text)
        assert cli.poll() is None, cli.stderr.read() if cli.stderr else cli.returncode
        assert time.monotonic() < deadline, "the command did not start"
        await asyncio.sleep(0.02)


async def test_the_command_dies_when_the_cli_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    async with open_store("sidecar", tmp_path / "store") as store:
        cli = popen_cli(
            "lock", str(store.directory), "hold", "cron", "nightly", "--ttl", "1s", "--",
            "sh", "-c", f'echo $$ > "{pidfile}"; exec sleep 30',
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        child: int | None = None
        try:
            child = await _read_pid(pidfile, cli)
            assert running(child)
            cli.kill()  # SIGKILL: the CLI can neither stop its command nor let the key go
            await asyncio.to_thread(cli.wait, 10)
            deadline = time.monotonic() + 3
            while running(child):
                assert time.monotonic() < deadline, "the command runs on without the CLI (and without the lock)"
                await asyncio.sleep(0.02)
            # the next holder gets the key once the dead CLI's lease runs out, and nothing runs twice
            async with store.lock("cron", ttl="1s").hold("nightly", wait="5s") as lease:
                assert lease is not None
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait(10)
            if child is not None and running(child):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
