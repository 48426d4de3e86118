"""A report the store cannot take now (its disk full, restarting) is sent again, with backoff, for up to twice
the lease: the job ends as its handler did once the store can write, not "worker lost"."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.engines.jobs import JobsEngine

from ..helpers import open_store


# contract: JOB-08
async def test_a_report_refused_for_a_while_lands_when_the_store_can_write_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = JobsEngine.report_now
    full_until = 0.0
    refused = 0

    def report_now(self: JobsEngine, peer: Any, r: Any) -> Any:
        nonlocal refused
        if time.monotonic() < full_until:
            refused += 1
            raise tinystore.UnavailableError("database tinystore-jobs: database or disk is full (SQLITE_FULL)")
        return real(self, peer, r)

    monkeypatch.setattr(JobsEngine, "report_now", report_now)
    async with open_store("embedded", tmp_path / "store") as store:
        queue = store.queue("q", dict, lease="5s")
        job_id = await queue.add({"n": 1})
        ran = asyncio.Event()

        async def handler(value: dict[str, int], run: tinystore.Run) -> str:
            nonlocal full_until
            full_until = time.monotonic() + 2.0  # the disk fills as the handler ends, for 2 s
            ran.set()
            return "done"

        worker = queue.work(handler)
        try:
            async with asyncio.timeout(20):
                await ran.wait()
                while (job := await queue.get(job_id)) is None or job.state != "succeeded":
                    assert job is not None and job.state == "running", job
                    await asyncio.sleep(0.1)
        finally:
            await worker.stop()
        assert refused >= 4  # before: it gave up after 4 tries (0.6 s), and the job waited for its lease
        assert job.attempts == 1 and job.result == "done" and job.error is None
