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
