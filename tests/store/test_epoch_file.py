"""DIR/EPOCH keeps the store's last epoch, from which fences grow across restarts (LOCK-02): a file that is
there but unreadable is a CorruptError at open, never silently replaced by the wall clock."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import pytest

import tinystore
from tinystore import CorruptError

from ..helpers import open_store


# contract: LOCK-02
async def test_a_garbage_epoch_file_is_a_corrupt_error_and_a_fixed_one_opens(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    store = await tinystore.open(directory, embedded=True, serve=False)
    async with store.lock("l").hold(1) as lease:
        first = lease.fence
    await store.close()

    (directory / "EPOCH").write_text("not a number\n")
    with pytest.raises(CorruptError, match="EPOCH: holds 'not a number"):
        await tinystore.open(directory, embedded=True, serve=False)
    (directory / "EPOCH").write_text("-5\n")
    with pytest.raises(CorruptError, match="negative"):
        await tinystore.open(directory, embedded=True, serve=False)

    # fixed as the message says (a number above every epoch given): the store opens, and fences still grow
    (directory / "EPOCH").write_text(f"{int(time.time() * 1000) + 86_400_000}\n")
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        async with store.lock("l").hold(1) as lease:
            assert lease.fence > first
    finally:
        await store.close()


@pytest.mark.parametrize("left", ["nothing", "LOCK", "sql", "LOCK and sql"])
async def test_a_missing_epoch_file_of_a_store_that_never_ran_is_made(tmp_path: Path, left: str) -> None:
    """A new directory; one whose first start stopped before it wrote EPOCH (its LOCK made, no sql/ yet); one
    given SQLite files in sql/ for a new store to take up (no LOCK); one given them whose first start failed
    before it wrote EPOCH (trial DN: a full disk; its LOCK made, it was refused from then on): no fence went out,
    and EPOCH is made."""
    directory = tmp_path / "s"
    directory.mkdir()
    if "LOCK" in left:
        (directory / "LOCK").write_text("")
    if "sql" in left:
        (directory / "sql").mkdir()
        sqlite3.connect(directory / "sql" / "app.db").execute("create table t (x)").connection.close()
    store = await tinystore.open(directory, embedded=True, serve=False)
    await store.close()
    assert int((directory / "EPOCH").read_text()) > 0


# contract: LOCK-02
@pytest.mark.parametrize("mode", ["sidecar", "private", "embedded"])
async def test_sqlite_files_given_to_a_new_store_open_in_every_mode_and_again(tmp_path: Path, mode: str) -> None:
    """From trial DK: the default open() makes DIR/server/ (its spawning lock, the sidecar's log) before the sidecar
    starts, and that folder was taken for a store that ran: a new directory given SQLite files in sql/ was refused
    for a missing EPOCH, then for good (the refused start had made its LOCK)."""
    directory = tmp_path / "s"
    directory.mkdir()
    (directory / "sql").mkdir()
    sqlite3.connect(directory / "sql" / "app.db").execute("create table t (x)").connection.close()
    for _ in range(2):
        async with open_store(mode, directory) as store:
            db = await store.database("app")
            await db.exec("insert into t values (1)")
    assert int((directory / "EPOCH").read_text()) > 0
    async with open_store(mode, directory) as store:
        assert await (await store.database("app")).all("select x from t") == [{"x": 1}, {"x": 1}]


# contract: LOCK-02
@pytest.mark.parametrize(
    "case",
    ["databases", "locks only", "LOCK removed too", "server/ removed too", "STARTED a folder", "old mark a folder"],
)
async def test_a_missing_epoch_file_of_a_store_that_ran_is_a_corrupt_error(tmp_path: Path, case: str) -> None:
    """From trial DF: removed from a store that had run, EPOCH was made again from the wall clock without a word;
    with the clock behind the saved epoch (stepped back since), fences went below those given before. From
    trial DI: so it was in a store of locks only (no database), and in one whose LOCK was removed too. From trial
    DS: so it was once its server/ folder (its runtime files) was removed too."""
    directory = tmp_path / "s"
    store = await tinystore.open(directory, embedded=True, serve=False)
    if case != "locks only":
        db = await store.database("app")
        await db.exec("create table t (x)")
    async with store.lock("l").hold(1) as lease:
        first = lease.fence
    await store.close()
    (directory / "EPOCH").unlink()
    if case == "LOCK removed too":
        (directory / "LOCK").unlink()
    if case == "server/ removed too":
        # (trial DS: the runtime folder cleaned out, and the store that ran was taken as new, its fences lower)
        shutil.rmtree(directory / "server")
    if case == "old mark a folder":
        # (trial DV: the mark of the version before, server/started, counted only as a file)
        (directory / "STARTED").unlink()
        (directory / "server" / "started").mkdir(parents=True, exist_ok=True)
    if case == "STARTED a folder":
        # (trial DU: one planted in its place, which the mark cannot replace, had the store taken as new)
        (directory / "STARTED").unlink()
        (directory / "STARTED").mkdir()
        shutil.rmtree(directory / "server")
    with pytest.raises(CorruptError, match=r"EPOCH: is missing, though the store has run before \(its sql/ folder"):
        await tinystore.open(directory, embedded=True, serve=False)
    assert not (directory / "EPOCH").exists()
    # fixed as the message says: the store opens, its rows and growing fences kept
    (directory / "EPOCH").write_text(f"{int(time.time() * 1000) + 86_400_000}\n")
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        if case != "locks only":
            db = await store.database("app")
            assert await db.all("select * from t") == []
        async with store.lock("l").hold(1) as lease:
            assert lease.fence > first
    finally:
        await store.close()


# contract: LOCK-02
async def test_a_backup_that_lost_its_epoch_file_is_a_corrupt_error(tmp_path: Path) -> None:
    """From trial DS: a backup holds EPOCH but not the mark that its store ran; with its EPOCH removed, it started
    from the wall clock, its fences below the original's (the original's EPOCH was ahead of the clock)."""
    directory, copy = tmp_path / "s", tmp_path / "copy"
    directory.mkdir()
    (directory / "EPOCH").write_text(f"{int(time.time() * 1000) + 86_400_000}\n")  # (as the error says to write)
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        async with store.lock("l").hold(1) as lease:
            first = lease.fence
        await store.backup(copy)
    finally:
        await store.close()
    (copy / "EPOCH").unlink()
    with pytest.raises(CorruptError, match=r"EPOCH: is missing, though the store has run before"):
        await tinystore.open(copy, embedded=True, serve=False)
    (copy / "EPOCH").write_text((directory / "EPOCH").read_text())
    store = await tinystore.open(copy, embedded=True, serve=False)
    try:
        async with store.lock("l").hold(1) as lease:
            assert lease.fence > first
    finally:
        await store.close()
