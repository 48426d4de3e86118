"""Trial EA: breaking the stop that interrupts what the databases run at the grace's end, and the sidecar started
in place of one whose store this process used."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

import tinystore

from ..cli.support import running
from ..helpers import ServerProcess
from .test_store01_owner import lock_is_free
from .test_trial_dz import files_open

# a write that runs for minutes, unless interrupted
LONG_WRITE = "insert into u select a.x from t a, t b, t c"


# contract: STORE-01
async def test_a_cancelled_close_lets_the_directory_go_only_once_the_databases_threads_have_ended(
    tmp_path: Path,
) -> None:
    """A close cancelled (a wait_for around it, a second Ctrl-C) let the directory go while a long write still ran,
    which then committed under the next owner; the directory is let go once the threads have ended now."""
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True)
    db = await store.database("app", migrations=[("001.sql", "create table t (x); create table u (x);")])
    await db.exec(
        "insert into t select a.x from (with recursive c(x) as (select 1 union all select x + 1 from c where x < 3000) "
        "select x from c) a"
    )
    write = asyncio.ensure_future(db.exec(LONG_WRITE))
    await asyncio.sleep(0.5)
    assert not write.done()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(store.close(), 0.3)
    # the close goes on (shielded) until asyncio.run, ending, cancels what is left: as here
    closing = store._close_task
    assert closing is not None and not closing.done()
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    async with asyncio.timeout(30):
        while not lock_is_free(directory):
            await asyncio.sleep(0.002)
    assert files_open(os.getpid(), "app.db") == []
    with pytest.raises(tinystore.TinystoreError):
        await write
    again = await tinystore.open(directory, embedded=True)
    try:
        assert await (await again.database("app")).scalar("select count(*) from u") == 0
    finally:
        await again.close()


@pytest.mark.parametrize("when", ["at open", "added later"])
async def test_a_migration_interrupted_by_a_stop_is_a_closed_error(tmp_path: Path, when: str) -> None:
    """Not InvalidError, which says to mend the migration's SQL."""
    from .test_trial_dz import BIG, FIRST

    store = await tinystore.open(tmp_path / "store", embedded=True)
    try:
        if when == "added later":
            await store.database("app", migrations=FIRST)
        task = asyncio.ensure_future(store.database("app", migrations=[*FIRST, ("002_big.sql", BIG)]))
        await asyncio.sleep(0.5)
        assert store._core is not None
        await store._core.stop(0.3)  # (what an embedded store's close runs, with a grace of 10 s)
        with pytest.raises(
            tinystore.ClosedError, match=r"migration 002_big\.sql: the store stopped while the statement"
        ):
            await task
    finally:
        await store.close()


# contract: STORE-06
async def test_a_client_does_not_join_another_store_made_where_its_own_was(tmp_path: Path) -> None:
    """A client paused through `tinystore stop DIR; mv DIR DIR.old`, then another process's open of DIR (a new,
    empty store there), joined that store and went on writing into it. A store has an id (DIR/ID), told each client:
    a client reconnects only to the store it used."""
    directory = tmp_path / "store"
    first = await tinystore.open(directory, embedded=True)
    await (await first.database("app", migrations=[("001.sql", "create table t (v);")])).exec(
        "insert into t values (1)"
    )
    client = await tinystore.open(directory, reconnect_timeout="20s")  # (reaches the embedded store's socket)
    try:
        db = await client.database("app")
        assert await db.scalar("select count(*) from t") == 1
        await first.close()
        (directory / "ID").write_text("0123456789abcdef0123456789abcdef\n")  # another store at the path, as it were
        second = await tinystore.open(directory, embedded=True)
        try:
            with pytest.raises(tinystore.UnavailableError, match="is another store now"):
                await db.exec("insert into t values (2)")
            assert await (await second.database("app")).scalar("select count(*) from t") == 1
        finally:
            await second.close()
    finally:
        await client.close()


async def test_a_backup_is_a_store_of_its_own(tmp_path: Path) -> None:
    """Trial EC: a backup kept the store's id, so two copies served at once were taken for one store, and a backup
    restored in the store's place (back in time: rows acknowledged after it gone) was joined without a word. A copy
    has an id of its own: the clients of the store are told it is another store."""
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    client = await tinystore.open(directory, reconnect_timeout="20s")
    try:
        db = await client.database("app", migrations=[("001.sql", "create table t (v);")])
        await db.exec("insert into t values (1)")
        await client.backup(tmp_path / "copy")
        assert (tmp_path / "copy" / "ID").read_text() != (directory / "ID").read_text()
        await db.exec("insert into t values (2)")  # after the backup: not in it
        server.stop()
        (directory).rename(tmp_path / "old")  # the documented restore: stop, move the store away, the copy in
        (tmp_path / "copy").rename(directory)
        server = ServerProcess(directory).start()
        with pytest.raises(tinystore.UnavailableError, match="a backup was restored there"):
            await db.scalar("select count(*) from t")
    finally:
        await client.close()
        server.stop()


@pytest.mark.parametrize("planted", ["a link to /dev/zero", "a FIFO", "a folder", "no id"])
async def test_an_id_file_that_is_no_id_does_not_stop_the_store(
    tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Trial EC: a link to /dev/zero planted at ID filled the memory as the store started, and a FIFO hung it."""
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True)
    await store.close()
    first = (directory / "ID").read_text().strip()
    (directory / "ID").unlink()
    if planted == "a link to /dev/zero":
        (directory / "ID").symlink_to("/dev/zero")
    elif planted == "a FIFO":
        os.mkfifo(directory / "ID")
    elif planted == "a folder":
        (directory / "ID").mkdir()
    else:
        (directory / "ID").write_text("not an id at all!\n")
    async with asyncio.timeout(20):
        store = await tinystore.open(directory, embedded=True)
    try:
        assert "its ID " in caplog.text
        if planted != "a folder":
            assert (directory / "ID").read_text().strip() not in ("", first)
    finally:
        await store.close()


async def test_a_store_whose_marks_were_removed_is_named_so(tmp_path: Path) -> None:
    """Trial EA: STARTED and EPOCH removed, the store stopped: its clients were told the directory "is gone or
    holds no store any more (removed or moved...)", of a directory still there with its databases."""
    import signal

    from tinystore.server import paths

    directory = tmp_path / "store"
    store = await tinystore.open(directory)
    pid = int((paths.read_address(directory) or {})["pid"])
    try:
        db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
        (directory / "STARTED").unlink()
        (directory / "EPOCH").unlink()
        os.kill(pid, signal.SIGTERM)
        async with asyncio.timeout(20):
            while running(pid):
                await asyncio.sleep(0.02)
        with pytest.raises(tinystore.UnavailableError, match="the directory holds no mark of a store that ran"):
            async with asyncio.timeout(20):
                await db.exec("insert into t values (1)")
        assert (directory / "sql" / "app.db").exists()
    finally:
        await store.close()


# contract: STORE-01
async def test_the_directory_is_let_go_only_once_a_backups_copy_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial EA: a backup under way as the store stopped kept the databases open after the lock was let go."""
    import threading
    import time

    from tinystore.server import backup as backups

    copying = threading.Event()
    copied = threading.Event()

    def slow_copy(directory: Path, dest: Path, cancelled: threading.Event | None = None) -> dict[str, object]:
        with open(directory / "sql" / "app.db", "rb"):
            copying.set()
            time.sleep(1.5)  # (a copy of a large database, which stops only at its end)
        copied.set()
        raise tinystore.ClosedError("stopped")

    monkeypatch.setattr(backups, "backup", slow_copy)
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True)
    await store.database("app", migrations=[("001.sql", "create table t (v);")])
    copy = asyncio.ensure_future(store.backup(tmp_path / "copy"))
    await asyncio.to_thread(copying.wait, 10)
    await store.close()
    while not lock_is_free(directory):
        await asyncio.sleep(0.002)
    assert copied.is_set(), "the directory was let go while the copy still had a database open"
    with contextlib.suppress(tinystore.TinystoreError):
        await copy


async def test_a_stop_that_interrupts_a_write_logs_no_unretrieved_error(tmp_path: Path) -> None:
    """Trial EC: "Future exception was never retrieved ... the store stopped while the statement ran" in the log of
    every stop that interrupted a write."""
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    client = await tinystore.open(directory, reconnect_timeout="2s")
    try:
        db = await client.database("app", migrations=[("001.sql", "create table t (x); create table u (x);")])
        await db.exec(
            "insert into t select x from (with recursive c(x) as (select 1 union all select x + 1 from c "
            "where x < 3000) select x from c)"
        )
        write = asyncio.ensure_future(db.exec(LONG_WRITE))
        await asyncio.sleep(0.5)
        await client.stop_server("300ms")
        with contextlib.suppress(tinystore.TinystoreError):
            await write
        assert server.proc is not None
        await asyncio.to_thread(server.proc.wait, 30)
        log = (directory / "serve.log").read_text()
        assert "interrupted" not in log or "never retrieved" not in log, log[-3000:]
        assert "never retrieved" not in log, log[-3000:]
    finally:
        await client.close()
        server.stop()


async def test_a_subscribe_command_whose_store_is_gone_ends(tmp_path: Path) -> None:
    """Trial EE: `tinystore channels DIR subscribe c` logged that its subscription ended (the store gone from its
    directory) and then waited for ever."""
    import shutil
    import subprocess
    import sys

    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    sub = subprocess.Popen(
        [sys.executable, "-m", "tinystore", "channels", str(directory), "subscribe", "c"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = await tinystore.open(directory)
        try:
            for _ in range(200):  # until its subscription is made
                if (await client.status())["channels"]["subscriptions"]:
                    break
                await asyncio.sleep(0.05)
        finally:
            await client.close()
        server.stop()
        shutil.rmtree(directory)
        out, err = await asyncio.to_thread(sub.communicate, timeout=30)
        assert sub.returncode == 1, (out, err)
        assert "its directory is gone" in err
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
        server.stop()


async def test_no_sidecar_is_started_for_another_store_than_the_one_a_client_used(tmp_path: Path) -> None:
    """Trial EE: a backup restored in place while a sidecar's clients ran: the SDK started a sidecar on it (it
    checked only that a store had run there), which served nobody (its clients refused it) and held the directory
    against `tinystore serve` for its idle time."""
    import subprocess
    import sys

    from tinystore.client.store import ensure_server
    from tinystore.server import paths

    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    await store.close()
    theirs = "0123456789abcdef0123456789abcdef"
    with pytest.raises(tinystore.UnavailableError, match="is another store now"):
        await ensure_server(directory, paths.socket_path(directory), [], existing=True, store_id=theirs)
    assert lock_is_free(directory)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tinystore", "serve", str(directory), "--sidecar", "--existing", "--store-id", theirs],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "another store is there now" in done.stderr, done.stderr
