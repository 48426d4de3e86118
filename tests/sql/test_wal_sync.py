"""Durable commits with the WAL synced behind the writer (engines/wal_sync.py): an exec returns only once a
sync of the WAL that began after its commit has returned; a failed sync is an OutcomeUnknownError; the pragmas
durability stands on cannot be changed by a client."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import tinystore
from tinystore import InvalidError, OutcomeUnknownError
from tinystore.engines import wal_sync


class _Disk:
    """A stand-in for fdatasync that can be held (the disk is slow) or made to fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()
        self.release.set()
        self.fail: OSError | None = None

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.release.wait(10)
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> _Disk:
    d = _Disk()
    monkeypatch.setattr(wal_sync, "_datasync", d)
    return d


async def _eventually(check: Callable[[], bool]) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not in time")


# contract: SQL-02
async def test_an_exec_returns_only_after_its_commit_is_synced(tmp_path: Path, disk: _Disk) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
        disk.release.clear()
        calls = disk.calls
        pending = asyncio.ensure_future(db.exec("insert into t values (1)"))
        await _eventually(lambda: disk.calls > calls)  # the commit is made and its sync began
        await asyncio.sleep(0.05)
        assert not pending.done(), "the exec returned before the WAL was on disk"
        disk.release.set()
        done = await asyncio.wait_for(pending, 5)
        assert done.changes == 1
        assert await db.scalar("select count(*) from t") == 1
    finally:
        disk.release.set()
        await store.close()


# contract: SQL-02
async def test_commits_that_wait_share_a_sync(tmp_path: Path, disk: _Disk) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
        disk.release.clear()
        calls = disk.calls
        first = asyncio.ensure_future(db.exec("insert into t values (0)"))
        await _eventually(lambda: disk.calls > calls)
        # while the disk holds the first sync, the writer goes on committing: 50 writes, not yet answered
        rest = [asyncio.ensure_future(db.exec("insert into t values (?)", i)) for i in range(1, 51)]
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in [first, *rest])
        disk.release.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), 5)
        assert disk.calls - calls <= 3  # one sync for the first, then one or two for all the others
        assert await db.scalar("select count(*) from t") == 51
    finally:
        disk.release.set()
        await store.close()


# contract: SQL-02
async def test_a_failed_sync_is_an_outcome_unknown_error_and_the_store_goes_on(tmp_path: Path, disk: _Disk) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
        disk.fail = OSError(5, "Input/output error")
        with pytest.raises(OutcomeUnknownError) as info:
            await db.exec("insert into t values (1)")
        assert "app" in info.value.message and "sync" in info.value.message
        disk.fail = None
        await db.exec("insert into t values (2)")
        assert await db.scalar("select count(*) from t") == 2  # the first commit was made, only not known synced
    finally:
        await store.close()


async def test_durability_os_does_not_sync(tmp_path: Path, disk: _Disk) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False, durability="os")
    try:
        db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
        for i in range(20):
            await db.exec("insert into t values (?)", i)
        assert disk.calls == 0
    finally:
        await store.close()


# contract: SQL-02
@pytest.mark.parametrize(
    "pragma",
    [
        "synchronous = off",
        "synchronous = 0",
        "journal_mode = delete",
        "journal_mode = memory",
        "locking_mode = exclusive",
    ],
)
async def test_the_pragmas_durability_stands_on_cannot_be_set(store: tinystore.Store, pragma: str) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
    with pytest.raises(InvalidError) as info:
        await db.exec(f"pragma {pragma}")
    assert "synchronous" in info.value.message
    await db.exec("insert into t values (1)")  # the session goes on
    assert await db.scalar("pragma journal_mode") == "wal"
    assert await db.scalar("select count(*) from t") == 1
