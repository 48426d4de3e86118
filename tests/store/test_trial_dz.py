"""Trial DZ: a stop that runs past its grace while a long migration still runs. The server let the directory go
(another server could own it) while its thread went on with the migration, and committed it 19 to 33 s later; a
client of the new owner was told the migration failed ("table big already exists") though it had been applied."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

import tinystore

from ..helpers import ServerProcess
from .test_store01_owner import lock_is_free

# a migration that runs for minutes, unless interrupted
BIG = (
    "create table big as with recursive c(x) as (select 1 union all select x + 1 from c where x < 2000000000) "
    "select x from c;"
)
FIRST = [("001.sql", "create table t (v);")]


def files_open(pid: int, name: str) -> list[str]:
    """The files of process ``pid`` whose path ends in ``name`` (or the like: ``-wal``, ``-shm``)."""
    found: list[str] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if f"/{name}" in target:
                    found.append(target)
    return found


# contract: STORE-01
# contract: STORE-05
@pytest.mark.parametrize("when", ["at open", "added later"])
async def test_a_stop_past_its_grace_interrupts_a_migration_before_it_lets_the_directory_go(
    tmp_path: Path, when: str
) -> None:
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    assert server.proc is not None
    pid = server.proc.pid
    store = await tinystore.open(directory)
    task: asyncio.Future[tinystore.Database] | None = None
    try:
        if when == "added later":
            await store.database("app", migrations=FIRST)
        task = asyncio.ensure_future(store.database("app", migrations=[*FIRST, ("002_big.sql", BIG)]))
        await asyncio.sleep(1.0)
        assert not task.done()  # the migration runs
        await store.stop_server("300ms")
        async with asyncio.timeout(30):
            while not lock_is_free(directory):
                await asyncio.sleep(0.005)
        # let go only once nothing of the old server holds the database's files (before: its thread still ran
        # the migration, and committed it later)
        assert files_open(pid, "app.db") == []
        async with asyncio.timeout(30):
            await asyncio.to_thread(server.proc.wait)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await store.close()
        server.kill()
    check = await tinystore.open(directory, embedded=True)
    try:
        db = await check.database("app")
        tables = {r["name"] for r in await db.all("select name from sqlite_master where type = 'table'")}
        assert "t" in tables and "big" not in tables  # the migration before stays; nothing of the one interrupted
    finally:
        await check.close()


def test_stop_tells_a_suspended_server_from_a_busy_one() -> None:
    """The stop's message when the server did not stop in time tells a suspended server from a busy one (trial DZ:
    one busy with a VACUUM was said to stop "once it runs again", as a suspended one would)."""
    import signal
    import subprocess

    from tinystore.cli import _suspended

    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not _suspended(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        for _ in range(200):
            if _suspended(proc.pid):
                break
            time.sleep(0.01)
        assert _suspended(proc.pid)
    finally:
        proc.kill()
        proc.wait()


async def test_a_client_of_an_embedded_store_that_is_gone_is_told_so_in_english(tmp_path: Path) -> None:
    """Trial DZ: "its server (a embedded server, pid N) is gone"."""
    import signal
    import subprocess
    import sys
    import textwrap

    from tinystore.server import paths

    directory = tmp_path / "store"
    script = textwrap.dedent(
        f"""
        import asyncio, tinystore
        async def main():
            store = await tinystore.open({str(directory)!r}, embedded=True)
            print("ready", flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        assert (await asyncio.to_thread(owner.stdout.readline)).strip() == "ready"
        store = await tinystore.open(directory, reconnect_timeout="1s")
        try:
            assert (paths.read_address(directory) or {}).get("mode") == "embedded"
            await store.status()
            owner.send_signal(signal.SIGKILL)
            owner.wait(10)
            with pytest.raises(tinystore.UnavailableError) as caught:
                await store.status()
            assert f"its server (an embedded server, pid {owner.pid}) is gone" in str(caught.value)
        finally:
            await store.close()
    finally:
        owner.kill()
        owner.wait()


async def test_the_command_line_says_a_checkpoint_needs_write(tmp_path: Path) -> None:
    """Trial DZ: `tinystore sql DIR "pragma wal_checkpoint(truncate)"` did not say --write, as VACUUM's refusal did."""
    import subprocess
    import sys

    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    await store.database("main", migrations=[("001.sql", "create table t (v);")])
    await store.close()
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tinystore", "sql", str(directory), "pragma wal_checkpoint(truncate)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "PRAGMA wal_checkpoint writes" in done.stderr and "`tinystore sql --write`" in done.stderr
