"""Trial CN (resources running out): the server out of memory answers every call, or drops the connection."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.server import listener, paths

from ..helpers import open_store, stop_sidecar


async def served(tmp_path: Path) -> tuple[tinystore.Store, tinystore.Store, tinystore.Database]:
    """An embedded store serving its socket in this process (its listener's code is this process's), a client
    through that socket, and a database of 4 rows of 300 kB."""
    owner = await tinystore.open(tmp_path / "s", embedded=True)
    client = await tinystore.open(tmp_path / "s")
    db = await client.database("app")
    await db.exec("create table t (b blob)")
    for _ in range(4):
        await db.exec("insert into t values (randomblob(300000))")
    return owner, client, db


async def test_an_answer_that_cannot_be_encoded_for_want_of_memory_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``send_result`` caught only TypeError and OverflowError: a MemoryError left the call unanswered, and the
    client waited for ever (its connection answered pings)."""
    owner, client, db = await served(tmp_path)
    try:
        real = listener.encode_answer

        def encode(value: Any) -> bytearray:
            if type(value).__name__ == "Rows" and len(value.rows) == 4:
                raise MemoryError
            return real(value)

        monkeypatch.setattr(listener, "encode_answer", encode)
        with pytest.raises(tinystore.UnavailableError) as info:
            await asyncio.wait_for(db.all("select b from t"), 10)
        assert "out of memory" in info.value.message
        assert await db.scalar("select count(*) from t") == 4  # the connection goes on
    finally:
        await client.close()
        await owner.close()


async def test_answers_that_cannot_be_joined_for_want_of_memory_go_out_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``flush`` joined the frames of a loop turn into one write: a MemoryError there lost them all, and their
    calls were never answered."""
    owner, client, db = await served(tmp_path)
    try:

        def join(parts: list[bytes]) -> bytes:
            raise MemoryError

        monkeypatch.setattr(listener, "_join", join)
        got = await asyncio.wait_for(asyncio.gather(*(db.all("select length(b) as n from t") for _ in range(8))), 10)
        assert [[r["n"] for r in rows] for rows in got] == [[300000] * 4] * 8
    finally:
        await client.close()
        await owner.close()


async def test_a_sidecar_that_crashes_in_c_code_leaves_why_in_its_log(tmp_path: Path) -> None:
    """Out of memory, an extension (msgspec encoding 40 MB) crashed the server with SIGSEGV, and sidecar.log
    ended with nothing of it: the server runs with faulthandler, which writes the stacks of its threads."""
    d = tmp_path / "s"
    store = await tinystore.open(d, idle="5s")
    try:
        pid = int(paths.read_address(d)["pid"])  # type: ignore[index]
        os.kill(pid, signal.SIGSEGV)
        for _ in range(200):  # (faulthandler writes the error, then each thread's stack: wait for both)
            log = (d / "server" / "sidecar.log").read_text(errors="replace")
            if "Segmentation fault" in log and ("Thread 0x" in log or "Current thread" in log):
                break
            await asyncio.sleep(0.05)
        assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
        assert "Thread 0x" in log or "Current thread" in log
    finally:
        await store.close()
        await stop_sidecar(d)


async def test_databases_leave_descriptors_for_connections(tmp_path: Path) -> None:
    """A server with 256 descriptors: databases opened until none was left, after which no client could connect
    ("stopped (SIGSTOP), stuck or overloaded") until a restart. A database that would eat into the descriptors
    kept for connections is refused, naming the limit; clients still get in."""
    d = tmp_path / "s"
    d.mkdir()
    log = (d / "serve.log").open("ab")
    server = subprocess.Popen(
        ["sh", "-c", f'ulimit -n 256 && exec "{sys.executable}" -m tinystore serve "{d}" --idle 30s'],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    try:
        for _ in range(400):
            info = paths.read_address(d)
            if info and Path(info["socket"]).exists():
                break
            assert server.poll() is None, (d / "serve.log").read_text()
            await asyncio.sleep(0.05)
        store = await tinystore.open(d)
        try:
            opened = 0
            with pytest.raises(tinystore.UnavailableError) as info_:
                for opened in range(200):
                    await store.database(f"tenant-{opened}")
            message = info_.value.message
            assert "may open 256 files" in message and "kept for connections" in message, message
            assert opened > 5
            others = [await asyncio.wait_for(tinystore.open(d), 10) for _ in range(8)]
            for other in others:
                assert (await (await other.database("tenant-0")).scalar("select 1")) == 1
                await other.close()
            assert (await store.status())["databases"]["tenant-0"]["open"]
        finally:
            await store.close()
    finally:
        server.terminate()
        server.wait(timeout=20)


async def test_a_backup_out_of_descriptors_is_unavailable_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing DIR/sql with no descriptor left was an "internal error" with a traceback in the log."""
    from tinystore.server import backup

    def database_files(sql_dir: Path) -> list[tuple[str, Path]]:
        raise OSError(errno.EMFILE, "Too many open files", str(sql_dir))

    async with open_store("embedded", tmp_path / "s") as store:
        await store.database("app")
        monkeypatch.setattr(backup, "database_files", database_files)
        with pytest.raises(tinystore.UnavailableError) as info:
            await store.backup(str(tmp_path / "copy"))
        message = info.value.message
        assert "Too many open files" in message and "raise `ulimit -n`" in message, message
        assert "remove it before trying again" in message


async def test_an_answer_whose_frames_cannot_be_made_for_want_of_memory_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frames of a big answer (its body cut into 1 MiB parts, each copied) were made outside the guard of
    its encoding: a MemoryError there left the call unanswered (trial CO)."""
    from tinystore.protocol import frames

    owner, client, db = await served(tmp_path)
    try:

        def send_response(self: Any, stream: int, body: bytes, chunk: int = 1 << 20) -> list[bytes]:
            raise MemoryError

        monkeypatch.setattr(frames.Connection, "send_response", send_response)
        with pytest.raises(tinystore.UnavailableError) as info:
            await asyncio.wait_for(db.all("select b from t"), 10)  # 1.2 MB: more than one frame
        assert "out of memory" in info.value.message
        assert await db.scalar("select count(*) from t") == 4
    finally:
        await client.close()
        await owner.close()


async def test_databases_opened_at_once_or_read_later_keep_the_reserve(tmp_path: Path) -> None:
    """The room was checked against the files open at that moment: databases opened at once all passed before any
    opened its files, and the open ones opened more at their first reads; the process ran out (trial CO)."""
    from tinystore.engines import descriptors

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = descriptors.open_descriptors()
    assert used is not None
    limit = used + 160
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        store = await tinystore.open(tmp_path / "s", embedded=True, limits=tinystore.Limits(databases=200))
        try:
            got = await asyncio.gather(*(store.database(f"d{i}") for i in range(60)), return_exceptions=True)
            opened = [db for db in got if isinstance(db, tinystore.Database)]
            refused = [e for e in got if isinstance(e, tinystore.UnavailableError)]
            assert opened and refused and len(opened) + len(refused) == 60, got
            assert "kept for connections" in refused[0].message
            for _ in range(3):  # every reader of every database opens its files
                await asyncio.gather(*(db.scalar("select 1") for db in opened for _ in range(8)))
            now = descriptors.open_descriptors()
            assert now is not None and limit - now >= descriptors.reserve(limit) // 2, (now, limit)
        finally:
            await store.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
