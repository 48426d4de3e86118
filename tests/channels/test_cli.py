"""`tinystore channels DIR subscribe` in one terminal, `publish` in another, with no server running first."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import tinystore

from ..helpers import stop_sidecar


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tinystore", *args]


async def test_subscribe_then_publish_from_two_commands_without_a_server(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    # the command line refuses a directory that holds no store: make one (and let it go)
    made = await tinystore.open(directory, embedded=True, serve=False)
    await made.close()
    listener = subprocess.Popen(
        _cli("channels", str(directory), "subscribe", "c/7", "--for", "30s"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the listener starts the directory's server (a sidecar) and subscribes; a publish from another command
        # reaches it (a listener owning the directory itself would refuse the publisher with InUseError)
        assert listener.stdout is not None
        line_task = asyncio.ensure_future(asyncio.to_thread(listener.stdout.readline))
        for _ in range(100):
            done = await asyncio.to_thread(
                subprocess.run, _cli("channels", str(directory), "publish", "c/7", '{"id": 1}'),
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if done.returncode != 0:  # the listener's sidecar is starting: it owns the directory already
                assert "error[in_use]" in done.stderr, done.stderr
                await asyncio.sleep(0.2)
                continue
            try:
                line = await asyncio.wait_for(asyncio.shield(line_task), 0.5)
                break
            except TimeoutError:
                assert listener.poll() is None, listener.stderr.read() if listener.stderr else ""
        else:
            raise AssertionError("the subscriber heard nothing")
        got = json.loads(line)
        assert got["branch"] == ["7"] and got["value"] == {"id": 1}
    finally:
        listener.terminate()
        await asyncio.to_thread(listener.wait, 20)
        await stop_sidecar(directory)
