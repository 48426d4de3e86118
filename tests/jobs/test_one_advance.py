"""Trial EV: within one advance of a test clock, a lost attempt's retry counted its backoff from the advance's end
(one advance of 100 s: due at 108 s, not at 38-40 s after a lease of 30 s ran out at 30 s)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import tinystore

from ..helpers import open_store
from .util import START, wait_until


# contract: JOB-03
async def test_a_lost_attempt_within_one_advance_is_retried_after_its_backoff_from_its_lease_end(
    tmp_path: Path,
) -> None:
    async with open_store("private", tmp_path / "store", clock=START) as store:  # (over a socket: leases)
        q = store.queue("lost", lease="30s", timeout="1h", expected="1h", attempts=5, backoff=("10s", "270s"))
        t0 = await store.clock.now()
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.set()
            await asyncio.sleep(3600)  # (the advance passes its lease: no renewal comes within it)

        jid = await q.add({})
        worker = q.work(handler, concurrency=1)
        try:
            await asyncio.wait_for(started.wait(), 10)
            await store.clock.advance("100s")

            async def retried() -> bool:
                job = await q.get(jid)
                return job is not None and job.errors[:1] != [] and job.attempts == 2

            await wait_until(retried, what="the retry")
            job = await q.get(jid)
            assert job is not None and job.errors[0].error == "worker lost"
            # the lease ran out at 30 s; its retry was due 8 to 10 s later (backoff 10 s, jitter 0.8 to 1.0)
            assert job.run_at is not None and 37 <= job.run_at.timestamp() - t0 <= 42, job
        finally:
            await worker.stop(grace=0)


# contract: JOB-11
async def test_a_job_claimed_within_an_advance_is_listed_stuck_when_it_is_reported_stuck(tmp_path: Path) -> None:
    # trial EX: its started_at was the timer's time (10 s of an advance of 100 s) while its expected time counted
    # from the advance's end: list(state="stuck") showed it at once, the report came 30 s later
    async with open_store("embedded", tmp_path / "store", clock=START) as store:
        q = store.queue("slow", timeout="60s", expected="30s", attempts=2)
        t0 = await store.clock.now()

        async def handler(value: Any, run: tinystore.Run) -> None:
            await asyncio.sleep(3600)

        worker = q.work(handler, concurrency=1)
        jid = await q.add({}, delay="10s")
        try:
            await asyncio.sleep(0.3)  # (the worker's claim waits: the job's timer at 10 s hands it the job)
            await store.clock.advance("100s")

            async def running() -> bool:
                job = await q.get(jid)
                return job is not None and job.state == "running" and job.started_at is not None

            await wait_until(running, what="the claim")

            async def written_again() -> bool:  # (the rewrite of started_at follows the claim's own write)
                job = await q.get(jid)
                return job is not None and job.started_at is not None and job.started_at.timestamp() - t0 >= 99

            await wait_until(written_again, what="started_at from the advance's end")
            assert (await q.list(state="stuck")).jobs == []
            await store.clock.advance("25s")
            assert (await q.list(state="stuck")).jobs == [] and (await store.status())["jobs"]["stuck_reports"] == 0
            await store.clock.advance("10s")

            async def reported() -> bool:
                return bool((await store.status())["jobs"]["stuck_reports"])

            await wait_until(reported, what="the stuck report")
            assert [j.id for j in (await q.list(state="stuck")).jobs] == [jid]
        finally:
            await worker.stop(grace=0)


# contract: JOB-02
async def test_a_job_ended_within_an_advance_is_kept_for_keep_from_its_end(tmp_path: Path) -> None:
    # trial EX: keep counted from the advance's end (a job dead at 30 s of an advance of 100 s, keep 10 s, was
    # still there at 106 s; advanced 10 s at a time it was gone by 52 s)
    async with open_store("private", tmp_path / "store", clock=START) as store:
        q = store.queue("kept", attempts=1, lease="30s", timeout="1h", expected="1h", keep="10s")
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.set()
            await asyncio.sleep(3600)

        jid = await q.add({})
        worker = q.work(handler, concurrency=1)
        try:
            await asyncio.wait_for(started.wait(), 10)
            await store.clock.advance("100s")  # the lease ran out at 30 s: dead then, kept to 40 s

            async def gone() -> bool:
                return await q.get(jid) is None

            # (within 3 s: the test clock runs on with real time, and would reach the advance's end + keep at 10 s)
            await wait_until(gone, timeout=3, what="the ended job's deletion")
        finally:
            await worker.stop(grace=0)
