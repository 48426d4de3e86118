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
