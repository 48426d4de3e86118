"""From trial FM: a running job cancelled, whose handler catches the cancel to clean up, and retried at once, is
started again by the same worker while the cancelled attempt still cleans up; a renewal then carries both attempts
of the job, the store names the job's id once as lost (the cancelled attempt's), and both were stopped: the retry
ended "worker lost", dead with attempts=1, its work never done."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from .util import wait_state


# contract: JOB-09
@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_a_retry_right_after_a_cancel_runs_while_the_cancelled_attempt_cleans_up(
    tmp_path: Path, mode: str
) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        q = store.queue("work", attempts=1, lease="2s", timeout="20s")
        ran: list[tuple[int, str]] = []

        async def handler(value: Any, run: tinystore.Run) -> str:
            ran.append((run.fence, "start"))
            retried = len(ran) > 1
            try:
                await asyncio.sleep(1.5 if retried else 30)  # (each past a renewal: every third of the 2 s lease)
            except asyncio.CancelledError:
                ran.append((run.fence, "cancelled"))
                try:
                    await asyncio.sleep(1.5)  # cleaning up
                except asyncio.CancelledError:
                    ran.append((run.fence, "cancelled again"))
                    raise
                ran.append((run.fence, "cleaned up"))
                return "late"  # (its report changes nothing: its fence is old)
            return "done"

        worker = q.work(handler, concurrency=2)
        try:
            job_id = await q.add({"n": 1})
            await wait_state(q, job_id, "running")
            assert await q.cancel(job_id) and await q.retry(job_id)
            job = await wait_state(q, job_id, "succeeded", "dead", timeout=15)
            assert job.state == "succeeded" and job.result == "done" and job.errors == [], job
            await asyncio.sleep(2.0)  # (the cancelled attempt's cleanup ends; its end changes nothing)
            assert (await q.get(job_id)).state == "succeeded"  # type: ignore[union-attr]
        finally:
            await worker.stop()
        first, second = ran[0][0], max(fence for fence, _ in ran)
        assert second > first and sorted(ran) == [
            (first, "cancelled"),
            (first, "cleaned up"),
            (first, "start"),
            (second, "start"),
        ], ran  # (the cancelled attempt's cleanup ran whole, not cancelled again)
