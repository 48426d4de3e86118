"""``store.backup`` and ``tinystore backup``: a copy of a running store, as a store directory of its own."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import tinystore

from ..helpers import ServerProcess, open_store, write_tokens

MODES = ["embedded", "private", "sidecar", "tcp"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_backup_taken_under_writes_opens_as_a_store_with_all_it_committed(mode: str, tmp_path: Path) -> None:
    # contract: LOCK-02
    dest = tmp_path / "copy"
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table a (id integer primary key, n)")
        await db.exec("create table b (id integer primary key, n)")
        queue = store.queue("mail", dict, database=db)
        job = await queue.add({"to": "ann"})
        async with store.lock("l").hold("k") as lease:
            fence = lease.fence
        stop = asyncio.Event()
        committed = 0

        async def writer() -> None:  # each transaction writes a row in both tables: a copy has as many in each
            nonlocal committed
            n = 0
            while not stop.is_set():
                n += 1

                async def both(tx: tinystore.SqlTx, n: int = n) -> None:
                    await tx.exec("insert into a (n) values (?)", n)
                    await tx.exec("insert into b (n) values (?)", n)

                await db.tx(both)
                committed = n

        task = asyncio.ensure_future(writer())
        while committed < 20:
            await asyncio.sleep(0.01)
        before = committed
        result = await store.backup(dest)
        stop.set()
        await task
    assert result["dest"] == str(dest) and set(result["databases"]) >= {"app"}
    assert result["databases"]["app"] == (dest / "sql" / "app.db").stat().st_size
    assert oct(dest.stat().st_mode & 0o777) == "0o700"
    copy = await tinystore.open(dest, embedded=True)
    try:
        cdb = await copy.database("app")
        a, b = await cdb.scalar("select count(*) from a"), await cdb.scalar("select count(*) from b")
        assert a == b >= before  # every transaction committed before the backup, none half
        got = await copy.queue("mail", dict, database=cdb).get(job)
        assert got is not None and got.value == {"to": "ann"}
        async with copy.lock("l").hold("k") as lease:
            assert lease.fence > fence  # fences grow on a store started from the copy
    finally:
        await copy.close()


# contract: JOB-08
async def test_a_store_restored_from_a_backup_gives_jobs_fences_above_the_originals(tmp_path: Path) -> None:
    """From trial AX: a job's fence counted in its row, so the restored copy gave the job fence 1 again while the
    original's attempt 1 still ran: its renewals and report matched the new attempt. A claim's fence is at least
    the store's epoch (which a store started from the copy raises above the original's)."""
    fences: list[int] = []

    async def handler(value: object, run: tinystore.Run) -> None:
        fences.append(run.fence)

    async with open_store("embedded", tmp_path / "s") as store:
        queue = store.queue("q")
        await queue.add("x")
        await store.backup(tmp_path / "copy")
        assert await queue.run_due(handler) == 1  # the original's attempt, after the copy
    async with open_store("embedded", tmp_path / "copy") as restored:
        assert await restored.queue("q").run_due(handler) == 1
    assert len(fences) == 2 and fences[1] > fences[0], fences


async def test_databases_not_opened_since_the_start_are_copied_too(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        await (await store.database("old")).exec("create table t (x)")
    async with open_store("embedded", tmp_path / "s") as store:
        assert set((await store.backup(tmp_path / "copy"))["databases"]) == {"old"}
    async with open_store("embedded", tmp_path / "copy") as copy:
        assert await (await copy.database("old")).scalar("select count(*) from t") == 0


async def test_bad_destinations_are_refused_naming_them_and_nothing_is_made(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "f").write_text("mine")
    async with open_store("embedded", tmp_path / "s") as store:
        await (await store.database("app")).exec("create table t (x)")
        for dest, words in (
            (tmp_path / "s" / "inside", "inside the store"),
            (tmp_path, "inside the store, or holds it"),
            (full, "exists and is not an empty folder"),
            (full / "f", "exists and is not an empty folder"),
        ):
            with pytest.raises(tinystore.InvalidError, match=words) as info:
                await store.backup(dest)
            assert str(dest) in str(info.value)
        assert not (tmp_path / "s" / "inside").exists() and (full / "f").read_text() == "mine"
        empty = tmp_path / "empty"
        empty.mkdir()
        assert set((await store.backup(empty))["databases"]) == {"app"}  # an empty folder is fine


async def test_a_backup_needs_the_admin_capability_and_an_absolute_path_over_a_url(tmp_path: Path) -> None:
    tokens, admin, data = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "s", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        store = await tinystore.connect(server.tcp, token=data)
        try:
            with pytest.raises(tinystore.PermissionDeniedError, match="admin"):
                await store.backup(tmp_path / "copy")
        finally:
            await store.close()
        store = await tinystore.connect(server.tcp, token=admin)
        try:
            with pytest.raises(tinystore.InvalidError, match="absolute"):
                await store.backup("copy")  # a path on the server's machine: relative to nothing known
            assert not (tmp_path / "copy").exists()
        finally:
            await store.close()
    finally:
        server.stop()


def test_the_cli_copies_a_running_store_and_names_a_bad_destination(tmp_path: Path) -> None:
    env = dict(os.environ)
    cli = [sys.executable, "-m", "tinystore"]
    server = ServerProcess(tmp_path / "s").start()
    try:
        subprocess.run(
            [*cli, "sql", str(tmp_path / "s"), "--write", "--create", "create table t (x)"], check=True, env=env
        )
        out = subprocess.run(
            [*cli, "backup", str(tmp_path / "s"), str(tmp_path / "copy"), "--json"],
            check=True, capture_output=True, text=True, env=env,
        )  # fmt: skip
        assert set(json.loads(out.stdout)["databases"]) == {"main"}
        bad = subprocess.run(
            [*cli, "backup", str(tmp_path / "s"), str(tmp_path / "copy")], capture_output=True, text=True, env=env
        )
        assert bad.returncode != 0 and "exists and is not an empty folder" in bad.stderr
        assert "Traceback" not in bad.stderr
    finally:
        server.stop()
    rows = subprocess.run(
        [*cli, "sql", str(tmp_path / "copy"), "select count(*) as n from t", "--json"],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert json.loads(rows.stdout.splitlines()[0]) == {"n": 0}


async def test_one_backup_at_a_time_and_a_cancelled_call_leaves_the_copy_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from tinystore.server import backup as backups

    release, started = threading.Event(), threading.Event()
    real = backups.backup

    def slow(directory: Path, dest: Path, cancelled: threading.Event | None = None) -> dict[str, object]:
        started.set()
        release.wait(10)
        return real(directory, dest, cancelled)

    monkeypatch.setattr(backups, "backup", slow)
    async with open_store("embedded", tmp_path / "s") as store:
        await (await store.database("app")).exec("create table t (x)")
        first = asyncio.ensure_future(store.backup(tmp_path / "one"))
        await asyncio.to_thread(started.wait, 5)
        with pytest.raises(tinystore.InUseError, match="another backup is under way"):
            await store.backup(tmp_path / "two")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        release.set()
        for _ in range(200):  # the copy goes on to its end
            if (tmp_path / "one" / "sql" / "app.db").exists():
                break
            await asyncio.sleep(0.02)
        assert (tmp_path / "one" / "sql" / "app.db").exists()
        for _ in range(500):  # and the next one may start once it ended (its LOCK comes last, then it lets go)
            try:
                await store.backup(tmp_path / "two")
                break
            except tinystore.InUseError:
                await asyncio.sleep(0.02)
        else:
            raise AssertionError("the cancelled backup never ended")
        assert (tmp_path / "one" / "LOCK").exists() and (tmp_path / "two" / "LOCK").exists()


async def test_odd_destinations_are_named_not_internal_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial AE: a NUL or an over-long name gave 'internal error', a dangling symlink 'File exists', and an empty
    folder of another user was taken as it was (its mode kept, its owner free to change the copy)."""
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "link").symlink_to(elsewhere)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 65534, 65534)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    async with open_store("embedded", tmp_path / "s") as store:
        await (await store.database("app")).exec("create table t (x)")
        for dest, error, words in (
            (str(tmp_path / "a\0b"), tinystore.InvalidError, "NUL"),
            (str(tmp_path / ("x" * 300)), tinystore.InvalidError, "too long"),
            (str(tmp_path / "link"), tinystore.InvalidError, "symbolic link"),
            (str(foreign), tinystore.PermissionDeniedError, "another user"),
            # trial AH: "" copied the store into the working folder; None and 5 were bare TypeErrors
            ("", tinystore.InvalidError, "give the folder"),
            (None, tinystore.InvalidError, "expected a path"),
            (5, tinystore.InvalidError, "expected a path"),
        ):
            with pytest.raises(error, match=words):
                await store.backup(dest)  # type: ignore[arg-type]
        assert not elsewhere.exists()
        assert list(cwd.iterdir()) == []


async def test_what_is_no_database_is_skipped_and_named_and_the_rest_copied(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        await (await store.database("app")).exec("create table t (x)")
        await (await store.database("zed")).exec("create table t (x)")
        (tmp_path / "s" / "sql" / "junk.db").write_bytes(b"not a database at all" * 100)
        (tmp_path / "outside.db").write_bytes(b"")
        (tmp_path / "s" / "sql" / "linked.db").symlink_to(tmp_path / "outside.db")
        result = await store.backup(tmp_path / "copy")
    assert set(result["databases"]) == {"app", "zed"}
    assert set(result["skipped"]) == {"junk", "linked"}
    assert "symbolic link" in result["skipped"]["linked"] and "not a database" in result["skipped"]["junk"]


async def test_a_store_that_stops_during_a_backup_says_so_and_leaves_no_store_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial AE: the copy went on after the store stopped (a new server had the directory meanwhile) and ended as
    a whole store, though its caller was told it failed; embedded, the caller got a bare CancelledError."""
    import threading

    from tinystore.server import backup as backups

    release, started, finished = threading.Event(), threading.Event(), threading.Event()
    real = backups.backup

    def slow(directory: Path, dest: Path, cancelled: threading.Event | None = None) -> dict[str, object]:
        started.set()
        release.wait(10)
        try:
            return real(directory, dest, cancelled)
        finally:
            finished.set()

    monkeypatch.setattr(backups, "backup", slow)
    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:
        await (await store.database("app")).exec("create table t (x)")
        call = asyncio.ensure_future(store.backup(tmp_path / "copy"))
        await asyncio.to_thread(started.wait, 5)
        closing = asyncio.ensure_future(store.close())
        with pytest.raises(tinystore.ClosedError, match=r"stopped during the backup.*remove it"):
            await call
    finally:
        release.set()
        await closing
    await asyncio.to_thread(finished.wait, 10)
    assert not (tmp_path / "copy" / "LOCK").exists()
    assert not (tmp_path / "copy" / "sql" / "app.db").exists()


async def test_a_server_killed_during_a_backup_is_said_to_leave_dest_maybe_incomplete(tmp_path: Path) -> None:
    """Trial DF: with its server killed during a backup, the caller got ClosedError ("the connection to the store
    dropped"), which said nothing of DEST (left with a NAME.db.partial file, mode 0644), though the store was not
    closed. It is UnavailableError saying DEST may be incomplete, and the partial file is 0600."""
    server = ServerProcess(tmp_path / "s").start()
    try:
        store = await tinystore.open(tmp_path / "s")
        try:
            db = await store.database("app")
            await db.exec("create table t (b)")
            await db.exec(
                "with recursive c(i) as (select 1 union all select i + 1 from c where i < 800) "
                "insert into t select randomblob(100000) from c"
            )
            partial = tmp_path / "copy" / "sql" / "app.db.partial"
            call = asyncio.ensure_future(store.backup(tmp_path / "copy"))
            for _ in range(5000):
                if partial.exists() or call.done():
                    break
                await asyncio.sleep(0.001)
            assert partial.exists(), "the copy was not seen under way"
            assert partial.stat().st_mode & 0o777 == 0o600
            server.kill()
            with pytest.raises(tinystore.UnavailableError) as info:
                await call
            assert info.value.message == (
                f"backup: the connection to the store dropped during the backup into {tmp_path / 'copy'} (its server "
                f"stopped, or the network failed); {tmp_path / 'copy'} may be incomplete: a complete backup has its "
                "LOCK (made last); without one, remove it before trying again"
            )
            assert not (tmp_path / "copy" / "LOCK").exists()
            # and no journal of the copy beside it (trial EU: "app.db.partial-journal" was left)
            assert sorted(p.name for p in partial.parent.iterdir()) == ["app.db.partial"]
            assert (tmp_path / "copy" / "BACKUP-UNFINISHED").exists()
        finally:
            await store.close()
    finally:
        server.stop()
    # trial HJ: `tinystore serve` on the copy made a new, empty store there (a new epoch, the partial file unused)
    copy = tmp_path / "copy"
    for mode in ("embedded", "private", "sidecar"):
        with pytest.raises(tinystore.CorruptError, match=r"is a backup that did not finish.*Remove it and back up"):
            async with open_store(mode, copy):
                pass
    serve = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tinystore", "serve", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode != 0 and "is a backup that did not finish" in serve.stderr, serve
    assert not (copy / "LOCK").exists() and not (copy / "EPOCH").exists()
    # (a copy by an earlier version had no mark: its partial file and no LOCK tell the same)
    (copy / "BACKUP-UNFINISHED").unlink()
    with pytest.raises(tinystore.CorruptError, match=r"sql/app.db.partial is there and no LOCK"):
        await tinystore.open(copy, embedded=True)


def test_a_copy_that_fails_leaves_neither_it_nor_its_journal(tmp_path: Path) -> None:
    """Trial EG: a disk full in the middle of a copy left DEST/sql/app.db.partial-journal (SQLite's, of the copy)."""
    import sqlite3

    from tinystore.server.backup import _copy_database

    source = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(source)) as conn:
        conn.execute("create table t (x)")
        conn.commit()
    target = tmp_path / "copy" / "app.db"
    target.parent.mkdir()
    journal = target.with_name("app.db.partial-journal")

    def disk_full() -> None:
        journal.write_bytes(b"\0" * 512)  # (as SQLite leaves it when a write of the copy fails)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        _copy_database(source, target, disk_full)
    assert sorted(p.name for p in target.parent.iterdir()) == []


# contract: STORE-05
def test_a_database_is_copied_in_steps_of_one_view_and_a_stop_is_heard_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial HV: the copy of a database was one step, so a stop waited for the whole copy of a big one (15 s past a
    grace of 1 s for 3 GB: the directory held, `tinystore stop` said "stopped", and the restart was refused). It
    goes in steps now, in one read transaction (a writer's commits meanwhile are not in the copy, nor restart it),
    and a stop is heard between two steps."""
    import sqlite3
    import threading

    from tinystore.server import backup as backups

    monkeypatch.setattr(backups, "BACKUP_STEP_PAGES", 20)
    source = tmp_path / "app.db"
    db = sqlite3.connect(source, isolation_level=None)
    db.execute("pragma journal_mode = wal")
    db.execute("create table t (id integer primary key, v blob)")
    db.execute("begin")
    for _ in range(2_000):
        db.execute("insert into t (v) values (randomblob(1000))")
    db.execute("commit")
    db.close()

    looks = 0
    writes = 0
    stop_writing = threading.Event()

    def writer() -> None:
        nonlocal writes
        other = sqlite3.connect(source, isolation_level=None)
        while not stop_writing.is_set():
            other.execute("insert into t (v) values (randomblob(1000))")
            writes += 1
        other.close()

    def look() -> None:
        nonlocal looks
        looks += 1
        if looks == 2:
            thread.start()  # (commits of another connection, from the second step on)
        if looks >= 2:
            while writes < looks * 3:  # (a few commits between each two steps)
                pass

    thread = threading.Thread(target=writer)
    try:
        size = backups._copy_database(source, tmp_path / "copy.db", look)
    finally:
        stop_writing.set()
        if thread.is_alive():
            thread.join()
    assert size > 0 and looks > 10 and writes > 0  # (in steps, with commits between them)
    copy = sqlite3.connect(tmp_path / "copy.db")
    assert copy.execute("select count(*) from t").fetchone()[0] == 2_000  # (the view the copy began with)
    assert copy.execute("pragma integrity_check").fetchone()[0] == "ok"
    copy.close()

    calls = 0

    def stopping() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise tinystore.ClosedError("the store stopped during the backup")

    with pytest.raises(tinystore.ClosedError):
        backups._copy_database(source, tmp_path / "cut.db", stopping)
    assert calls == 3  # (heard mid-copy)
    assert not list(tmp_path.glob("cut.db*"))  # (nothing of the cut copy left)


# contract: STORE-05
def test_a_copy_is_synced_step_by_step_and_a_stop_heard_before_its_last_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial HY: the copy was synced once, whole, at its end (hundreds of MB, an fsync nothing cuts short), and a
    stop's grace ending meanwhile waited for it: the backup's answer came after its connection closed
    (``UnavailableError``, not ``ClosedError``). Each step's pages are synced after it now, and a stop heard
    before the last sync."""
    import sqlite3

    from tinystore.server import backup as backups

    monkeypatch.setattr(backups, "BACKUP_STEP_PAGES", 20)
    source = tmp_path / "app.db"
    db = sqlite3.connect(source, isolation_level=None)
    db.execute("create table t (id integer primary key, v blob)")
    db.execute(
        "insert into t (v) select randomblob(1000) from "
        "(with recursive c(n) as (select 1 union all select n + 1 from c where n < 1000) select n from c)"
    )
    db.close()
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real_fdatasync(fd)

    monkeypatch.setattr(backups.os, "fdatasync", fdatasync)
    backups._copy_database(source, tmp_path / "copy.db", lambda: None)
    assert len(synced) > 10 and synced == sorted(synced)  # (as the copy grows, each step)

    looks = 0
    last_syncs: list[Path] = []
    monkeypatch.setattr(backups, "_fsync", last_syncs.append)
    steps = len(synced)

    def stopped_after_the_last_step() -> None:
        nonlocal looks
        looks += 1
        if looks > steps:
            raise tinystore.ClosedError("the store stopped during the backup")

    with pytest.raises(tinystore.ClosedError):
        backups._copy_database(source, tmp_path / "cut.db", stopped_after_the_last_step)
    assert last_syncs == []  # (heard before the copy's last sync)
    assert not list(tmp_path.glob("cut.db*"))


# contract: STORE-05
async def test_a_backup_stops_at_the_end_of_a_stops_grace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial HW: the copy learnt of a stop only once the listeners had closed (the grace, then a second to answer
    the calls cut, then the linger): `tinystore stop --grace 1s` ended the server 6 to 9 s later. It stops between
    two steps at the grace's end, as the calls under way are interrupted then."""
    import time

    from tinystore.server import backup as backups

    monkeypatch.setattr(backups, "BACKUP_STEP_PAGES", 1)
    real = backups._copy_database

    def slow(source: Path, target: Path, stop: Callable[[], None]) -> int:
        def slow_stop() -> None:
            time.sleep(0.01)  # (500 steps: some 5 s in all)
            stop()

        return real(source, target, slow_stop)

    monkeypatch.setattr(backups, "_copy_database", slow)
    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, v blob)")
        await db.exec(
            "with recursive c(n) as (select 1 union all select n + 1 from c where n < 2000) "
            "insert into t (v) select randomblob(1000) from c"
        )
        client = await tinystore.open(tmp_path / "s")  # (over the embedded store's socket, as the CLI's backup)
        call = asyncio.ensure_future(client.backup(tmp_path / "copy"))
        for _ in range(500):
            if list((tmp_path / "copy" / "sql").glob("*.partial")):
                break
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await store._core.stop(0.3)
        took = loop.time() - began
        with pytest.raises(tinystore.ClosedError, match="stopped during the backup"):
            await call
        await client.close()
        assert took < 2.0, took
        assert not list((tmp_path / "copy" / "sql").glob("*.partial"))
    finally:
        await store.close()
