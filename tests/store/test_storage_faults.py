"""Faults of the file system and of the processes around a store: a child forked by the owner keeps neither the
directory's lock nor its socket; a lock held by some other process is named as such, not by a stale pid; a
store that cannot write its files (a full disk, a read-only file system) says so in one error, and a sidecar
that cannot start says why at once."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.server import dirlock

from ..helpers import stop_sidecar
from .test_store01_owner import lock_is_free


# contract: STORE-01
async def test_a_child_forked_by_the_owner_keeps_neither_its_lock_nor_its_socket(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys, time
        import tinystore

        async def main():
            store = await tinystore.open({str(directory)!r}, embedded=True)
            pid = os.fork()
            if pid == 0:  # the child: outlives its parent, as a worker process would
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 1)
                os.dup2(null, 2)
                time.sleep(60)
                os._exit(0)
            print(pid, flush=True)
            os._exit(0)  # the owner dies without closing anything (as kill -9 would)

        asyncio.run(main())
        """
    )
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    child = int(done.stdout.strip())
    try:
        assert lock_is_free(directory)  # before, the child kept DIR/LOCK: nobody could own the store
        async with asyncio.timeout(20):
            store = await tinystore.open(directory)  # a new sidecar, reached through a fresh socket
            try:
                assert (await store.status())["mode"] == "sidecar"
            finally:
                await store.close()
    finally:
        os.kill(child, signal.SIGKILL)
        await stop_sidecar(directory)


# contract: STORE-01
def test_a_lock_held_by_another_program_is_not_blamed_on_a_stale_pid(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    directory.mkdir()
    (directory / "LOCK").write_text(f"{os.getpid()}\n")  # what a process that died long ago wrote
    holder = subprocess.Popen(["flock", str(directory / "LOCK"), "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while lock_is_free(directory):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(tinystore.InUseError) as info:
            dirlock.DirLock(directory).acquire()
        message = info.value.message
        assert "already owns" not in message, message  # it said this very process owned it
        assert "locked by a process other than the one that wrote LOCK" in message and "fuser" in message
    finally:
        holder.kill()
        holder.wait()


def test_what_the_file_system_refuses_at_start_is_one_clear_error() -> None:
    full = dirlock.storage_error("store /s: cannot save its epoch", OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(full, tinystore.UnavailableError) and "the disk is full" in full.message
    ro = dirlock.storage_error("store /s: cannot open LOCK", OSError(errno.EROFS, "Read-only file system"))
    assert isinstance(ro, tinystore.PermissionDeniedError) and "Read-only file system" in ro.message


async def test_an_epoch_that_cannot_be_saved_stops_the_start_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("EPOCH.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    directory = tmp_path / "store"
    with pytest.raises(tinystore.UnavailableError, match="cannot save its epoch in EPOCH: No space left on device"):
        await tinystore.open(directory, embedded=True)
    assert not (directory / "EPOCH.tmp").exists()
    assert lock_is_free(directory)  # nothing is left owned


async def test_a_sidecar_that_cannot_start_says_why_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    (directory / "sql").mkdir(parents=True)
    (directory / "EPOCH").write_text("not a number\n")
    started = time.monotonic()
    with pytest.raises(tinystore.CorruptError, match="EPOCH: holds 'not a number"):
        await tinystore.open(directory)  # before: 20 s of sidecars started again and again, then a log scrap
    assert time.monotonic() - started < 10
