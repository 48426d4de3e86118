"""STORE-01: one process owns a store's directory at a time; the lock goes away with the process."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.errors import InUseError

from ..helpers import ServerProcess

AT_ONCE = 0.5  # seconds: "refused at once" (no waiting for the lock)


def lock_is_free(directory: Path) -> bool:
    """Whether nobody holds ``DIR/LOCK`` (taken and let go again at once)."""
    fd = os.open(directory / "LOCK", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


async def refused_at_once(directory: Path, **kw: object) -> InUseError:
    t = time.monotonic()
    with pytest.raises(InUseError) as info:
        await tinystore.open(directory, **kw)  # type: ignore[arg-type]
    assert time.monotonic() - t < AT_ONCE + (5 if kw.get("private") else 0)
    assert str(directory.resolve()) in info.value.message
    return info.value


async def insert_and_count(store: tinystore.Store) -> int:
    db = await store.database("app")
    await db.exec("create table if not exists t (a)")
    await db.exec("insert into t values (1)")
    n: int = await db.scalar("select count(*) from t")
    return n


# contract: STORE-01
async def test_second_embedded_owner_in_this_process_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "store"
    first = await tinystore.open(d, embedded=True)
    try:
        err = await refused_at_once(d, embedded=True)
        assert err.code == "in_use"
        assert f"pid {os.getpid()}" in err.message
        # the refusal changed nothing for the owner
        assert await insert_and_count(first) == 1
        assert not lock_is_free(d)
    finally:
        await first.close()
    assert lock_is_free(d)
    second = await tinystore.open(d, embedded=True)
    try:
        assert await insert_and_count(second) == 2
    finally:
        await second.close()


# contract: STORE-01
async def test_embedded_without_serving_still_owns(tmp_path: Path) -> None:
    d = tmp_path / "store"
    first = await tinystore.open(d, embedded=True, serve=False)
    try:
        await refused_at_once(d, embedded=True, serve=False)
        await refused_at_once(d, embedded=True)
        assert not lock_is_free(d)
    finally:
        await first.close()
    assert lock_is_free(d)


# contract: STORE-01
async def test_other_process_is_refused_while_embedded_owns(tmp_path: Path) -> None:
    d = tmp_path / "store"
    owner = await tinystore.open(d, embedded=True)
    try:
        # a `tinystore serve DIR` in another process: exits at once, naming the directory
        t = time.monotonic()
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "tinystore", "serve", str(d)],
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        elapsed = time.monotonic() - t
        err = proc.stderr.decode()
        assert proc.returncode == 1, err
        assert f"error[in_use] store {d.resolve()}" in err
        assert elapsed < 10  # interpreter start-up included; no waiting on the lock
        # a private child server: InUseError in this process, naming the directory
        await refused_at_once(d, private=True)
        # the ServerProcess helper sees the server exit
        with pytest.raises(RuntimeError, match="in_use"):
            ServerProcess(d).start(timeout=15)
        assert await insert_and_count(owner) == 1
    finally:
        await owner.close()
    server = ServerProcess(d).start()
    try:
        store = await tinystore.open(d)  # the serving process is found, not a second owner
        try:
            assert (await store.status())["pid"] == server.proc.pid  # type: ignore[union-attr]
            assert await insert_and_count(store) == 2
        finally:
            await store.close()
    finally:
        assert server.stop() == 0
    assert lock_is_free(d)


# contract: STORE-01
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_lock_goes_away_with_the_process(tmp_path: Path, sig: signal.Signals) -> None:
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    try:
        assert not lock_is_free(d)
        err = await refused_at_once(d, embedded=True)
        assert f"pid {server.proc.pid}" in err.message  # type: ignore[union-attr]
        server.kill(sig)
        assert lock_is_free(d)
        # a new owner succeeds at once, even though the killed server left its files behind
        t = time.monotonic()
        store = await tinystore.open(d, embedded=True)
        assert time.monotonic() - t < 5
        try:
            assert await insert_and_count(store) == 1
            assert (await store.status())["pid"] == os.getpid()
        finally:
            await store.close()
    finally:
        server.stop()


OWNER = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[-1], "LOCK"), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("owned", flush=True)
sys.stdin.read()
"""


# contract: STORE-01
@pytest.mark.parametrize("server", [False, True])
async def test_an_owner_still_starting_is_said_to_be_starting(tmp_path: Path, server: bool) -> None:
    # trial BU: two uvicorn workers opened a store with embedded=True at once; the second was told its owner "does
    # not serve its socket (an embedded store opened with serve=False, ...)" and to open it there with serve=True,
    # though the owner served (the default) and was only starting. An owner that took the directory moments ago
    # and wrote no address yet (as a store does while it opens its engines) is said to be starting; one that
    # runs `tinystore serve` (a sidecar that won the race to start: sidecar.log's "sidecar not needed" lines) is
    # said to be a server
    d = tmp_path / "store"
    d.mkdir()
    # (a server's command line as the tinystore script's: `python …/bin/tinystore serve DIR`)
    script = tmp_path / "bin" / ("tinystore" if server else "app.py")
    script.parent.mkdir()
    script.write_text(OWNER)
    argv = [sys.executable, str(script), *(["serve"] if server else []), str(d)]
    owner = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None and owner.stdout.readline() == b"owned\n"
        message = (await refused_at_once(d, embedded=True)).message
        who = "a tinystore server" if server else "another process"
        assert message.startswith(f"store {d}: the directory is owned by {who} (pid {owner.pid}) that took it "), (
            message
        )
        assert message.endswith(
            f"ago and does not serve its socket yet: {'it is' if server else 'most likely it is'} still starting (a "
            "store serves its socket once its engines are open); open the store again in a moment, with "
            "tinystore.open() to connect to it rather than own it"
        ), message
        assert "serve=" not in message
        # taken long ago and still not served: not starting (serve=False, or its server/ folder removed)
        os.utime(d / "LOCK", (time.time() - 60, time.time() - 60))
        message = (await refused_at_once(d, private=True)).message
        if server:  # (a server still starting on a slow disk, or one whose server/ folder was removed: trial CM)
            assert message.startswith(f"store {d}: the directory is owned by a tinystore server (pid {owner.pid}) "), (
                message
            )
            assert "does not serve its socket: it is still starting" in message and "serve=" not in message
            assert "or its server/ folder was removed while it ran (then stop it: tinystore stop" in message
        else:
            assert message == (
                f"store {d}: the directory is owned by another process (pid {owner.pid}), which does not serve its "
                "socket (an embedded store opened with serve=False, or one whose server/ folder was removed while "
                "it ran): nothing can connect to it; use the store in that process, or open it there with serve=True"
            )
    finally:
        owner.communicate(timeout=10)
    assert lock_is_free(d)
