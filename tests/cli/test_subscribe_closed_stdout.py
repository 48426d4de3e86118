"""``tinystore channels DIR subscribe CH | head -1``: once the reader closed the pipe, the subscription stops
and the command exits with status 0, quietly (no "the handler raised BrokenPipeError", no traceback)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import tinystore

from ..channels.support import subscriptions
from ..helpers import open_store
from .support import popen_cli


async def _first_line(store: tinystore.Store, proc: subprocess.Popen[bytes]) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while await subscriptions(store) < 1:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, "the CLI did not subscribe"
        await asyncio.sleep(0.02)
    await store.channel("c").under(7).publish({"n": 0})
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 10)
    got: dict[str, object] = json.loads(line)
    return got


async def _ended_quietly(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stderr is not None
    err = (await asyncio.to_thread(proc.stderr.read)).decode(errors="replace")
    assert proc.wait(5) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "raised" not in err, err


async def test_a_reader_that_closed_the_pipe_ends_the_subscription(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:  # serves its socket: the CLI connects to it
        proc = popen_cli(
            "channels", str(store.directory), "subscribe", "c/7", stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert (await _first_line(store, proc))["value"] == {"n": 0}
            assert proc.stdout is not None
            proc.stdout.close()  # as `head -1` does once it has its line
            n, deadline = 1, time.monotonic() + 5
            while proc.poll() is None:  # a publisher goes on publishing
                assert time.monotonic() < deadline, "subscribe went on after its stdout was closed"
                await store.channel("c").under(7).publish({"n": n})
                n += 1
                await asyncio.sleep(0.05)
            await _ended_quietly(proc)
            assert await subscriptions(store) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


async def test_a_closed_pipe_ends_it_on_a_quiet_channel_too(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        proc = popen_cli(
            "channels", str(store.directory), "subscribe", "c/7", stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            await _first_line(store, proc)
            assert proc.stdout is not None
            proc.stdout.close()  # and nothing more is published: no write finds the pipe closed
            deadline = time.monotonic() + 5
            while proc.poll() is None:
                assert time.monotonic() < deadline, "subscribe went on after its stdout was closed"
                await asyncio.sleep(0.05)
            await _ended_quietly(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
