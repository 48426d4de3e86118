"""``queue.retry`` and ``queue.cancel`` cancelled at any point: what the store committed is followed through (trial
GQ: a retry cancelled after its commit left a job queued that no worker saw, that could be neither cancelled nor
retried until a restart; a cancel cancelled after its commit ended the job but never told its running handler)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import tinystore

from .util import wait_state


async def _cancel_after(call: Any, turns: int) -> None:
    """Run ``call`` (a coroutine), cancelled after ``turns`` turns of the loop."""
    task = asyncio.ensure_future(call)
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# contract: JOB-01
# contract: JOB-09
async def test_a_cancelled_retry_leaves_a_job_that_runs_or_stays_cancelled(store: tinystore.Store) -> None:
    q = store.queue("retried")
    ran: list[int] = []

    async def handler(value: dict[str, int], run: tinystore.Run) -> None:
        ran.append(value["n"])

    worker = q.work(handler, concurrency=4)
    try:
        ids = []
        for k in range(24):
            jid = await q.add({"n": k}, delay="1h")
            assert await q.cancel(jid)
            await _cancel_after(q.retry(jid), k % 12)
            ids.append(jid)
        for jid in ids:
            job = await wait_state(q, jid, "succeeded", "cancelled")
            if job.state == "cancelled":  # (the retry never began) it can be retried still, and then runs
                assert await q.retry(jid)
            await wait_state(q, jid, "succeeded")
        assert sorted(ran) == list(range(24))
    finally:
        await worker.stop()


# contract: JOB-09
async def test_a_cancelled_cancel_of_a_running_job_still_stops_its_handler(store: tinystore.Store) -> None:
    q = store.queue("stopped")
    started: dict[int, asyncio.Event] = {}
    stopped: dict[int, asyncio.Event] = {}

    async def handler(value: dict[str, int], run: tinystore.Run) -> None:
        n = value["n"]
        started[n].set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped[n].set()
            raise

    worker = q.work(handler, concurrency=2)
    try:
        for k in range(16):
            started[k], stopped[k] = asyncio.Event(), asyncio.Event()
            jid = await q.add({"n": k})
            await asyncio.wait_for(started[k].wait(), 10)
            await _cancel_after(q.cancel(jid), k % 8)
            await q.cancel(jid)  # (True when the cancelled call never began, else False: it is cancelled already)
            await wait_state(q, jid, "cancelled")
            await asyncio.wait_for(stopped[k].wait(), 10)  # its handler was told, whichever call did it
    finally:
        await worker.stop()
