"""A cancelled ``store.close()`` or ``worker.stop()`` leaves the close or the stop going on, and a later call
waits for it: nothing is left half-closed (a locked directory, a live connection, handlers still running), and
no task of the SDK outlives the close."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store, stop_sidecar


def sdk_tasks() -> list[str]:
    """The SDK's tasks still pending (by coroutine name), other than this test's own."""
    me = asyncio.current_task()
    out = []
    for t in asyncio.all_tasks():
        if t is me or t.done():
            continue
        code = getattr(t.get_coro(), "cr_code", None)
        if code is not None and "tinystore" in code.co_filename:
            out.append(code.co_qualname)
    return out


async def cancel_soon(aw: Any, after: float = 0.05) -> None:
    task = asyncio.ensure_future(aw)
    await asyncio.sleep(after)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_cancelled_close_goes_on_and_a_second_close_waits_for_it(tmp_path: Path, mode: str) -> None:
    directory = tmp_path / "s"
    if mode == "embedded":
        store = await tinystore.open(directory, embedded=True)
    else:
        store = await tinystore.open(directory, idle="5s")
    try:
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.set()
            await asyncio.sleep(1)

        q = store.queue("q")
        await q.add({})
        store.queue("q").work(handler)
        sub = await store.channel("ev").subscribe(lambda m: None)
        await asyncio.wait_for(started.wait(), 10)
        await cancel_soon(store.close())  # cancelled while the worker's grace runs
        await asyncio.wait_for(store.close(), 20)
        assert not sub.active
        assert sdk_tasks() == [], sdk_tasks()
        if mode == "embedded":  # the directory was let go: it opens again
            again = await tinystore.open(directory, embedded=True)
            await again.close()
    finally:
        await store.close()
        if mode == "sidecar":
            await stop_sidecar(directory)


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_cancelled_worker_stop_goes_on_and_a_shorter_one_cuts_its_grace(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        started = asyncio.Event()
        running = 0

        async def handler(value: Any, run: tinystore.Run) -> None:
            nonlocal running
            running += 1
            started.set()
            try:
                await asyncio.sleep(30)
            finally:
                running -= 1

        q = store.queue("q")
        jid = await q.add({})
        worker = q.work(handler)
        await asyncio.wait_for(started.wait(), 10)
        await cancel_soon(worker.stop(grace="20s"))
        await asyncio.wait_for(worker.stop(grace=0), 10)  # not the first call's 20 s
        assert running == 0, "a handler still runs after stop() returned"
        job = await q.get(jid)
        assert job is not None and (job.state, job.attempts) == ("queued", 0), (job.state, job.attempts)
