"""A store closed right after it opened (a quick CLI call) leaves no task behind: asyncio logs nothing."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
from pathlib import Path
from typing import Any

import tinystore


async def make_store(directory: Path) -> None:
    """A store whose jobs database exists (so that opening it starts loading the queues)."""
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        db = await store.database("main")
        await db.exec("create table if not exists t (a)")
        await store.queue("mail").add({"to": "a@x"})
    finally:
        await store.close()


async def test_a_quick_open_and_close_leaves_no_unretrieved_exception(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    await make_store(directory)
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        for i in range(20):
            store = await tinystore.open(directory, embedded=True, serve=False)
            if i % 2:
                await store.database("main")
            await store.close()
            gc.collect()  # a task's unretrieved exception is reported when the task is collected
        await asyncio.sleep(0.05)
        gc.collect()
    finally:
        loop.set_exception_handler(old)
    assert seen == [], [c.get("message") for c in seen]
    # and the jobs are all there
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        jobs = await store.database("tinystore-jobs")
        assert await jobs.scalar("select count(*) from _tinystore_jobs") == 1


def run_sql(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tinystore", "sql", str(directory), "--json", "select 1 as x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_a_quick_cli_call_prints_nothing_on_stderr(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    await make_store(directory)
    for _ in range(6):
        done = await asyncio.to_thread(run_sql, directory)
        assert done.returncode == 0, done.stderr
        assert done.stdout == '{"x": 1}\n'
        assert done.stderr == ""
