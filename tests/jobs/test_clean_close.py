"""A store closed right after it opened (a quick CLI call) leaves no task behind: asyncio logs nothing."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

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


# contract: JOB-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
@pytest.mark.parametrize("how", ["worker", "run_due"])
async def test_close_with_a_grace_cancels_running_handlers_within_it(tmp_path: Path, mode: str, how: str) -> None:
    # trial FT: a test's teardown waited 10 s for a handler still running (its timeout fired there, and the next
    # test found the directory held); close(grace=0) cancels them at once, their jobs handed back
    store = await tinystore.open(tmp_path / "s", embedded=mode == "embedded", private=mode == "private")
    queue = store.queue("q", dict)
    started = asyncio.Event()

    async def handler(value: dict[str, Any], run: tinystore.Run) -> None:
        started.set()
        await asyncio.sleep(3600)

    job = await queue.add({"a": 1})
    runs = None
    if how == "worker":
        queue.work(handler)
    else:
        runs = asyncio.ensure_future(queue.run_due(handler))
    await asyncio.wait_for(started.wait(), 10)
    began = time.monotonic()
    await store.close(grace=0)
    assert time.monotonic() - began < 5
    if runs is not None:
        await runs
    with pytest.raises(tinystore.InvalidError, match="grace"):
        await store.close(grace="soon")
    store = await tinystore.open(tmp_path / "s", embedded=mode == "embedded", private=mode == "private")
    try:
        got = await store.queue("q", dict).get(job)
        assert got is not None and got.state == "queued" and got.attempts == 0, got  # handed back, not counted
    finally:
        await store.close()


# contract: JOB-05
async def test_a_later_close_with_a_shorter_grace_cuts_the_first_short(tmp_path: Path) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True)
    queue = store.queue("q", dict)
    started = asyncio.Event()

    async def handler(value: dict[str, Any], run: tinystore.Run) -> None:
        started.set()
        await asyncio.sleep(3600)

    await queue.add({"a": 1})
    queue.work(handler)
    await asyncio.wait_for(started.wait(), 10)
    began = time.monotonic()
    first = asyncio.ensure_future(store.close())  # (10 s of grace)
    await asyncio.sleep(0.2)
    await store.close(grace="0s")
    await first
    assert time.monotonic() - began < 5


# contract: JOB-05
async def test_a_shorter_grace_asked_before_the_first_closes_grace_began_is_heard(tmp_path: Path) -> None:
    # trial FU: asked a few loop turns after close(grace=30), before the worker's stop had begun its grace,
    # close(grace=0) was not heard: the close took the 30 s
    for turns in range(8):
        store = await tinystore.open(tmp_path / f"s{turns}", embedded=True)
        queue = store.queue("q", dict)
        started = asyncio.Event()

        async def handler(value: dict[str, Any], run: tinystore.Run, started: asyncio.Event = started) -> None:
            started.set()
            await asyncio.sleep(3600)

        job = await queue.add({"a": 1})
        queue.work(handler)
        await asyncio.wait_for(started.wait(), 10)
        began = time.monotonic()
        first = asyncio.ensure_future(store.close(grace=30))
        for _ in range(turns):
            await asyncio.sleep(0)
        await store.close(grace=0)
        await first
        assert time.monotonic() - began < 5, f"{turns} turns between the two closes"
        store = await tinystore.open(tmp_path / f"s{turns}", embedded=True)
        try:
            got = await store.queue("q", dict).get(job)
            assert got is not None and got.state == "queued" and got.attempts == 0, got
        finally:
            await store.close()


# contract: JOB-05
async def test_a_close_refused_on_another_loop_keeps_no_grace(tmp_path: Path) -> None:
    # trial FX: close(grace=0) from another event loop raised InvalidError, but its grace was kept, and the real
    # close later cancelled the handlers at once
    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:

        def elsewhere() -> str:
            async def close() -> None:
                await store.close(grace=0)

            try:
                asyncio.run(close())
            except tinystore.InvalidError as exc:
                return exc.message
            return "closed"

        said = await asyncio.to_thread(elsewhere)
        assert "event loop" in said, said
        assert store._close_grace is None
    finally:
        await store.close()
