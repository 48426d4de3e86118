"""Faults of the file system and of the processes around a store: a child forked by the owner keeps neither the
directory's lock nor its socket; a lock held by some other process is named as such, not by a stale pid; a
store that cannot write its files (a full disk, a read-only file system) says so in one error, and a sidecar
that cannot start says why at once."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.server import dirlock

from ..cli.support import running
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
# contract: STORE-02
def test_a_child_forked_by_the_owner_opens_the_store_through_its_socket(tmp_path: Path) -> None:
    """From trial AS: the child inherited the parent's list of directories it holds, and was told that it owned
    the store itself without serving it (a multiprocessing worker could not open the store at all)."""
    directory = tmp_path / "store"
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys
        import tinystore

        async def child():
            store = await asyncio.wait_for(tinystore.open({str(directory)!r}), 20)
            try:
                n = await (await store.database("app")).scalar("select count(*) from t")
                print("child", (await store.status())["mode"], n, flush=True)
            finally:
                await store.close()

        async def main():
            store = await tinystore.open({str(directory)!r}, embedded=True)
            db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
            await db.exec("insert into t values (1)")
            pid = os.fork()
            if pid == 0:
                try:
                    asyncio.run(child())
                    os._exit(0)
                except BaseException as exc:
                    print("child failed:", type(exc).__name__, exc, flush=True)
                    os._exit(1)
            _, status = await asyncio.to_thread(os.waitpid, pid, 0)
            await store.close()
            sys.exit(os.waitstatus_to_exitcode(status))

        asyncio.run(main())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    assert "child embedded 1" in done.stdout, done.stdout


# contract: STORE-02
async def test_a_sidecar_that_cannot_listen_on_its_socket_says_why_at_once(tmp_path: Path) -> None:
    """From trial AS: a folder where the socket goes made the sidecar die with a traceback; open() started one
    every 2 s for 20 s, and `tinystore serve` printed the traceback."""
    directory = tmp_path / "store"
    (directory / "server" / "sock").mkdir(parents=True)
    (directory / "server").chmod(0o700)
    started = time.monotonic()
    with pytest.raises(tinystore.UnavailableError, match=r"cannot listen on its socket .*sock: Is a directory"):
        await tinystore.open(directory)
    assert time.monotonic() - started < 10
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tinystore", "serve", str(directory)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error[unavailable] store "), done.stderr


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


async def test_an_address_file_that_cannot_be_written_stops_the_start_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From trial DP: a full disk as the address file was written raised a bare OSError, left address.tmp, and
    the socket listened on in the embedded store's process with nobody serving it."""
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if str(src).endswith("address.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    directory = tmp_path / "store"
    with pytest.raises(tinystore.UnavailableError, match="cannot write its address file: No space left on device"):
        await tinystore.open(directory, embedded=True)
    assert not (directory / "server" / "address.tmp").exists()
    assert lock_is_free(directory)
    monkeypatch.undo()
    sock = directory / "server" / "sock"
    assert not sock.exists() or not _accepts(sock)
    store = await tinystore.open(directory, embedded=True)  # room again: it opens
    await store.close()


def _accepts(sock: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
        return True


async def test_a_sidecar_that_cannot_start_says_why_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    (directory / "sql").mkdir(parents=True)
    (directory / "EPOCH").write_text("not a number\n")
    started = time.monotonic()
    with pytest.raises(tinystore.CorruptError, match="EPOCH: holds 'not a number"):
        await tinystore.open(directory)  # before: 20 s of sidecars started again and again, then a log scrap
    assert time.monotonic() - started < 10


# contract: STORE-02
async def test_a_sidecar_that_exits_without_a_word_on_a_full_disk_is_said_to_have_found_it_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From trial AJ: on a full disk the sidecar cannot even write its log; open() started one after another for
    20 s, then guessed. It now says at once that the disk is full."""
    from tinystore.client import store as store_module

    class Full:
        f_files, f_favail, f_bavail, f_frsize = 1000, 900, 3, 4096

    real_statvfs = os.statvfs
    directory = tmp_path / "store"
    monkeypatch.setattr(store_module, "_server_cmd", lambda *a: [sys.executable, "-c", "raise SystemExit(1)"])
    monkeypatch.setattr(os, "statvfs", lambda p: Full() if Path(p) == directory else real_statvfs(p))
    started = time.monotonic()
    with pytest.raises(tinystore.UnavailableError, match=r"the sidecar could not start: the disk is full \(12 KiB"):
        await tinystore.open(directory)
    assert time.monotonic() - started < 10


async def test_queues_that_cannot_be_loaded_at_start_are_loaded_once_they_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tinystore.engines.sql import SqlEngine

    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True)
    await store.queue("q", dict).add({"n": 1})
    await store.close()

    real = SqlEngine.open
    refusals = 0

    async def open_(self: SqlEngine, name: str, migrations: Any = ()) -> Any:
        nonlocal refusals
        if name == "tinystore-jobs" and refusals < 1:
            refusals += 1
            raise tinystore.UnavailableError("database tinystore-jobs: disk I/O error (SQLITE_IOERR): ...")
        return await real(self, name, migrations)

    monkeypatch.setattr(SqlEngine, "open", open_)
    store = await tinystore.open(directory, embedded=True)
    try:
        async with asyncio.timeout(10):
            # before: never, until a client opened it (listed while it loads, its counts None until loaded)
            while not [q for q in (await store.status())["jobs"]["queues"] if not q["loading"]]:
                await asyncio.sleep(0.05)
        assert (await store.status())["jobs"]["queues"][0]["queued"] == 1
        assert "jobs: cannot load the queues: database tinystore-jobs: disk I/O error" in caplog.text
    finally:
        await store.close()


@pytest.mark.parametrize("what", ["directory", "socket"])
async def test_a_sidecar_whose_directory_or_socket_is_removed_stops(tmp_path: Path, what: str) -> None:
    """Before: with its directory removed it acknowledged writes into deleted files, and a new store on the
    path gave the same lock key to a second holder; with its socket removed nobody could reach it again. Its
    clients do not make a new, empty store where the removed one was."""
    import shutil

    from tinystore.server import paths

    directory = tmp_path / "store"
    store = await tinystore.open(directory)
    pid = int((paths.read_address(directory) or {})["pid"])
    try:
        db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
        await db.exec("insert into t values (1)")
        if what == "directory":
            shutil.rmtree(directory)
        else:
            paths.socket_path(directory).unlink()
        async with asyncio.timeout(10):
            while running(pid):
                await asyncio.sleep(0.05)
        if what == "directory":
            # at once (within a reconnect's backoff): it is not coming back, so no waiting out reconnect_timeout
            with pytest.raises(tinystore.UnavailableError, match="its directory is gone or holds no store any more"):
                async with asyncio.timeout(5):
                    await db.exec("insert into t values (2)")
            assert not directory.exists()  # no new, empty store in its place
        else:  # a new sidecar, on the same files: the data is all there
            assert await db.scalar("select count(*) from t") == 1
    finally:
        await store.close()
        if running(pid):
            os.kill(pid, signal.SIGKILL)
        await stop_sidecar(directory)


async def test_a_sidecar_whose_directory_is_moved_stops_and_its_clients_make_no_new_store(tmp_path: Path) -> None:
    """SQLite cannot go on with files that moved (an I/O error at the next write): the server stops, and its
    clients say the store is gone from its path instead of starting a new, empty one there (a split brain)."""
    from tinystore.server import paths

    directory = tmp_path / "a" / "store"
    store = await tinystore.open(directory)
    pid = int((paths.read_address(directory) or {})["pid"])
    try:
        db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
        await db.exec("insert into t values (1)")
        (tmp_path / "a").rename(tmp_path / "b")  # a parent renamed
        async with asyncio.timeout(10):
            while running(pid):
                await asyncio.sleep(0.05)
        with pytest.raises(tinystore.UnavailableError, match="its directory is gone or holds no store any more"):
            async with asyncio.timeout(5):
                await db.exec("insert into t values (2)")
        assert not directory.exists()
    finally:
        await store.close()
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    moved = await tinystore.open(tmp_path / "b" / "store", embedded=True)  # all of it, where it went
    try:
        assert await (await moved.database("app")).scalar("select count(*) from t") == 1
    finally:
        await moved.close()


@pytest.mark.parametrize("what", ["moved", "removed"])
async def test_a_private_store_whose_directory_goes_away_is_not_made_again_empty(tmp_path: Path, what: str) -> None:
    """The private server stops when its directory is moved or removed (SQLite cannot go on); the SDK used to
    start it again, which made a new, empty store on the path (a split brain: a count of 0, writes gone astray).
    Every call now says the store is gone."""
    import shutil

    directory = tmp_path / "a" / "store"
    store = await tinystore.open(directory, private=True)
    try:
        db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
        await db.exec("insert into t values (1)")
        if what == "moved":
            (tmp_path / "a").rename(tmp_path / "b")
        else:
            shutil.rmtree(directory)
        async with asyncio.timeout(10):
            while store._dead is None:
                await asyncio.sleep(0.05)
        with pytest.raises(tinystore.UnavailableError, match="its directory is gone or holds no store any more"):
            await db.scalar("select count(*) from t")
        assert not directory.exists()  # no new, empty store in its place
    finally:
        await store.close()
    if what == "moved":
        moved = await tinystore.open(tmp_path / "b" / "store", embedded=True)
        try:
            assert await (await moved.database("app")).scalar("select count(*) from t") == 1
        finally:
            await moved.close()


# contract: STORE-06
async def test_a_private_server_whose_socket_was_removed_is_started_again(tmp_path: Path) -> None:
    """From trial AR: it stops (no new client could reach it) and exited 0, as a stop asked for, so the SDK kept
    it stopped and every call said "stopped (stop_server, tinystore stop or SIGTERM)". Nobody asked: it exits
    with EXIT_LOST_PLACE now, and the SDK starts it again on the same files (as after a kill)."""
    from tinystore.server import paths

    directory = tmp_path / "store"
    store = await tinystore.open(directory, private=True)
    try:
        db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
        await db.exec("insert into t values (1)")
        pid = int((paths.read_address(directory) or {})["pid"])
        paths.socket_path(directory.resolve()).unlink()
        async with asyncio.timeout(10):
            while running(pid):
                await asyncio.sleep(0.05)
        async with asyncio.timeout(30):
            assert await db.scalar("select count(*) from t") == 1
        assert int((paths.read_address(directory) or {})["pid"]) != pid
        assert store._dead is None
    finally:
        await store.close()


async def test_a_store_made_again_where_one_was_removed_keeps_its_new_sidecar(tmp_path: Path) -> None:
    """``rm -rf data`` while its sidecar still runs, then a new store there: the old sidecar stops (its directory
    is gone) and used to take the new sidecar's socket file with it on its way out (the same path), so the new
    sidecar stopped too, a second later: leases lost, subscribers told to reload on a brand-new store."""
    import shutil

    from tinystore.server import paths

    directory = tmp_path / "data"
    old = await tinystore.open(directory, idle="30s")
    old_pid = int((paths.read_address(directory) or {})["pid"])
    await old.close()  # the old sidecar goes on, idle
    shutil.rmtree(directory)
    store = await tinystore.open(directory)
    new_pid = int((paths.read_address(directory) or {})["pid"])
    try:
        assert new_pid != old_pid
        missed: list[Any] = []
        await store.channel("c").subscribe(lambda m: None, on_missed=missed.append)
        async with asyncio.timeout(10):
            while running(old_pid):  # it sees its directory gone within a second, and stops
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # a place check of the new one, had its socket gone
        assert running(new_pid), "the new sidecar stopped: the old one removed its socket"
        assert paths.socket_path(directory).exists()
        assert (await store.status())["pid"] == new_pid
        assert missed == []
    finally:
        await store.close()
        for pid in (old_pid, new_pid):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        await stop_sidecar(directory)


async def test_open_tries_again_when_the_sidecar_it_found_dropped_the_handshake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sidecar found just as it exits (idle, or killed) resets the handshake: open looks again (and starts
    a new one) rather than failing at once."""
    from tinystore.client.transport import RemoteTransport

    real = RemoteTransport._connect_once
    resets = 0

    async def connect_once(self: RemoteTransport, until: float | None = None) -> Any:
        nonlocal resets
        if resets == 0:
            resets += 1
            await self.endpoint()  # the server is found...
            raise tinystore.UnavailableError("the store closed the connection during the handshake: reset")
        return await real(self, until)

    monkeypatch.setattr(RemoteTransport, "_connect_once", connect_once)
    directory = tmp_path / "store"
    store = await tinystore.open(directory)
    try:
        assert resets == 1 and (await store.status())["mode"] == "sidecar"
    finally:
        await store.close()
        await stop_sidecar(directory)


@pytest.mark.parametrize(
    ("err", "kind"),
    [(errno.EROFS, tinystore.PermissionDeniedError), (errno.ENOSPC, tinystore.UnavailableError)],
)
async def test_a_new_store_on_a_full_or_read_only_disk_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int, kind: type[tinystore.TinystoreError]
) -> None:
    def mkdir(self: Path, *args: Any, **kw: Any) -> None:
        raise OSError(err, os.strerror(err), str(self))

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(kind, match=f"open: cannot make the store's directory .*{os.strerror(err)}"):
        await tinystore.open(tmp_path / "new", embedded=True)


@pytest.mark.parametrize("how", ["private", "sidecar"])
async def test_opening_again_a_directory_this_process_holds_unserved_says_so_at_once(tmp_path: Path, how: str) -> None:
    # trial T (F2): with the directory held here by embedded=True, serve=False, open(private=True) said it was
    # "owned by another process (pid <this pid>)", and open(dir) waited 20 s for a sidecar that could not start
    directory = tmp_path / "s"
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        started = time.monotonic()
        with pytest.raises(tinystore.InUseError) as caught:
            await tinystore.open(directory, private=(how == "private"))
        assert time.monotonic() - started < 5
        message = str(caught.value)
        assert f"this process (pid {os.getpid()}) already owns the directory" in message, message
        assert "another process" not in message, message
        if how == "sidecar":
            assert "serve=False" in message and "serve=True" in message, message
    finally:
        await store.close()


async def test_a_sidecar_started_again_just_before_its_directory_moves_makes_no_new_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial DY: `tinystore stop DIR`, then `mv DIR DIR.old` at once (a backup's restore) while a worker is
    connected. The worker's SDK started a sidecar in place of the stopped one just before the move; the sidecar,
    slower to start than the move, made a new, empty store at DIR (a new EPOCH), and the worker went on there.
    A sidecar started in place of one that ran only opens the store that ran, and the SDK says it is gone."""
    from tinystore.client import store as store_mod
    from tinystore.server import paths

    directory = tmp_path / "a" / "store"
    real_spawn = store_mod._spawn_sidecar
    spawned: list[Any] = []

    def spawn_as_it_moves(d: Path, extra: list[str], log_path: Path) -> Any:
        got = real_spawn(d, extra, log_path)
        if not spawned:
            # the move lands as the sidecar starts (an interpreter takes a good part of a second to start)
            (tmp_path / "a").rename(tmp_path / "b")
        spawned.append(got[0])
        return got

    store = await tinystore.open(directory)
    pid = int((paths.read_address(directory) or {})["pid"])
    try:
        db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
        await db.exec("insert into t values (1)")
        monkeypatch.setattr(store_mod, "_spawn_sidecar", spawn_as_it_moves)
        os.kill(pid, signal.SIGTERM)  # as `tinystore stop` does
        async with asyncio.timeout(10):
            while running(pid):
                await asyncio.sleep(0.02)
        with pytest.raises(tinystore.UnavailableError, match="its directory is gone or holds no store any more"):
            async with asyncio.timeout(20):
                await db.exec("insert into t values (2)")
        assert spawned
        for child in spawned:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(child.wait, 10)  # (it refuses, at once; before, it served a new store)
        assert not directory.exists(), "a new, empty store was made where the old one was"
    finally:
        await store.close()
        if running(pid):
            os.kill(pid, signal.SIGKILL)
        for child in spawned:
            child.kill()
    moved = await tinystore.open(tmp_path / "b" / "store", embedded=True)  # all of it, where it went
    try:
        assert await (await moved.database("app")).scalar("select count(*) from t") == 1
    finally:
        await moved.close()


@pytest.mark.parametrize("there", ["nothing", "an empty folder"])
def test_a_sidecar_started_in_place_of_one_that_ran_makes_no_store(tmp_path: Path, there: str) -> None:
    """(Trial DY) what the SDK starts in place of a sidecar whose store it used: it serves that store or nothing."""
    directory = tmp_path / "store"
    if there == "an empty folder":
        directory.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tinystore", "serve", str(directory), "--sidecar", "--existing"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "no store that ran is there any more (removed or moved?)" in done.stderr
    assert list(directory.iterdir()) == [] if there == "an empty folder" else not directory.exists()
