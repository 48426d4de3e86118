"""Trial CM (breaking the last session's fixes): what it found in the jobs, each as a check."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.client.jobs import configure
from tinystore.protocol.jobs import Options

from ..helpers import open_store


# contract: JOB-03
@pytest.mark.parametrize(("mode", "concurrency"), [("embedded", 1), ("embedded", 2), ("sidecar", 1)])
async def test_a_spent_job_that_snoozes_under_a_live_worker_ends_dead(
    tmp_path: Path, mode: str, concurrency: int
) -> None:
    """Attempts lowered to 1 while a job's second attempt ran, which then snoozed: the job went back to wait with
    as many attempts made as allowed, and the claim the worker had waiting took it before the job was ended (the
    end ran in a task after the placing's pump): it ran a third attempt under a limit of 1."""
    async with open_store(mode, tmp_path / "s") as store:
        q = store.queue("q", attempts=3, backoff=("10ms", "10ms"))
        jid = await q.add({"x": 1})
        runs: list[int] = []
        go = asyncio.Event()
        second = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> Any:
            runs.append(run.attempt)
            if len(runs) == 1:
                raise RuntimeError("first")
            if len(runs) == 2:
                second.set()
                await go.wait()
                return run.snooze(0)
            return "ran again"

        worker = q.work(handler, concurrency=concurrency)
        try:
            await asyncio.wait_for(second.wait(), 10)
            await configure(store, "q", Options(attempts=1))
            go.set()
            for _ in range(100):
                job = await q.get(jid)
                assert job is not None
                if job.state not in ("queued", "running", "failed"):
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # (a third attempt, were one claimed, would run now)
        finally:
            await worker.stop()
        job = await q.get(jid)
        assert runs == [1, 2], runs
        assert job is not None and (job.state, job.attempts) == ("dead", 1), job
