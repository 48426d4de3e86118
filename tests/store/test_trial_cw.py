"""Trial CW: `tinystore stop` on a directory a program or a command owns without serving it, and a database file
that is a folder."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

import tinystore

from ..cli.support import popen_cli, run_cli
from ..helpers import ServerProcess, open_store

SLOW = "with recursive c(i) as (select 1 union all select i + 1 from c where i < 30000000) select count(*) from c"


async def test_stop_names_the_program_that_owns_the_directory_without_serving_it(tmp_path: Path) -> None:
    # it said "no server is running there (start one with `tinystore serve …`)", and serve then failed: in use
    directory = tmp_path / "s"
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        done = await asyncio.to_thread(run_cli, "stop", str(directory))
        assert done.returncode == 1, done
        text = " ".join(done.stderr.split())
        assert f"pid {os.getpid()}" in text and "`tinystore stop` stops a server only" in text, text
        assert "no server is running" not in text
        assert await store.database("app") is not None  # (untouched)
    finally:
        await store.close()


async def test_stop_names_the_command_that_owns_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    async with open_store("embedded", directory) as store:
        await store.database("app")
    slow = popen_cli("sql", str(directory), "--db", "app", SLOW)
    try:
        deadline = time.monotonic() + 10
        while (directory / "LOCK").read_text().strip() != str(slow.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        done = await asyncio.to_thread(run_cli, "stop", str(directory))
        assert done.returncode == 1, done
        text = " ".join(done.stderr.split())
        assert f"the command `tinystore sql` (pid {slow.pid})" in text, text
    finally:
        slow.kill()
        slow.wait()


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_database_file_that_is_no_file_is_named_so(tmp_path: Path, kind: str) -> None:
    # SQLite's "unable to open database file" was explained as out of file descriptors, or a moved directory
    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    if kind == "folder":
        (directory / "sql" / "x.db").mkdir()
    else:
        os.mkfifo(directory / "sql" / "x.db")
    done = run_cli("sql", str(directory), "--db", "x", "select 1")
    assert done.returncode == 1, done
    text = " ".join(done.stderr.split())
    what = "is a folder" if kind == "folder" else "is not a regular file"
    assert f"database x: {directory / 'sql' / 'x.db'} {what}" in text, text
    assert "descriptors" not in text
