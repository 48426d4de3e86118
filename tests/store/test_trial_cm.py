"""Trial CM (breaking the last session's fixes): a server slow to start is waited for, not named unreachable."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.server import dirlock

# a real `tinystore serve`, whose EPOCH write (after it took LOCK, before it listens) takes 3 s: a slow disk
SLOW_SERVER = r"""
import sys, time
import tinystore.server.core as core
slow = core.next_epoch
core.next_epoch = lambda *a: (time.sleep(3), slow(*a))[1]
sys.argv = ["tinystore", "serve", sys.argv[-1], "--idle", "10s"]
from tinystore.cli import main
main()
"""


def _script(tmp_path: Path, text: str) -> str:
    """``text`` as a script named ``tinystore``, run as ``python …/tinystore serve DIR`` (as the installed one)."""
    path = tmp_path / "bin" / "tinystore"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


# contract: STORE-02
async def test_open_waits_for_a_server_that_took_the_directory_but_listens_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that took ``LOCK`` long ago without an address was named "an embedded store opened with
    serve=False" at once, though it was a ``tinystore serve`` still starting (its age past STARTING: 10 s, made
    1 s here): open() must wait for it within its deadline, as it did before."""
    monkeypatch.setattr(dirlock, "STARTING", 1.0)
    d = tmp_path / "store"
    server = subprocess.Popen([sys.executable, _script(tmp_path, SLOW_SERVER), "serve", str(d)])
    try:
        deadline = time.monotonic() + 20
        while not (d / "LOCK").exists() or not (d / "LOCK").read_text().strip():
            assert time.monotonic() < deadline and server.poll() is None, "the server did not take the directory"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # past STARTING, still starting
        started = time.monotonic()
        store = await tinystore.open(d)
        try:
            assert await store.status() is not None
            assert time.monotonic() - started < 15
        finally:
            await store.close()
    finally:
        server.terminate()
        server.wait(timeout=15)


def test_a_server_still_starting_past_starting_is_named_a_starting_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a caller whose deadline passed is told: not "an embedded store opened with serve=False"
    monkeypatch.setattr(dirlock, "STARTING", 1.0)
    d = tmp_path / "store"
    server = subprocess.Popen(
        [sys.executable, _script(tmp_path, SLOW_SERVER.replace("sleep(3)", "sleep(8)")), "serve", str(d)]
    )
    try:
        deadline = time.monotonic() + 20
        while not (d / "LOCK").exists() or not (d / "LOCK").read_text().strip():
            assert time.monotonic() < deadline and server.poll() is None, "the server did not take the directory"
            time.sleep(0.05)
        time.sleep(1.5)
        assert dirlock.unreachable_owner(d) is None
        with pytest.raises(tinystore.InUseError) as info:
            dirlock.DirLock(d).acquire()
        message = info.value.message
        assert "a tinystore server" in message and "still starting" in message and "serve=False" not in message
    finally:
        server.terminate()
        server.wait(timeout=15)
