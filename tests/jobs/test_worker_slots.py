"""A worker claims for every free slot at once: slots freed while one of its claims is under way (waiting for
jobs, or for its commit) are asked for by another claim, not left idle until that claim returns."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tinystore


async def _waiting_claims(store: tinystore.Store, queue: str) -> int:
    status = await store.status()
    for q in status["jobs"]["queues"]:
        if q["queue"] == queue:
            return int(q["waiting_claims"])
    return 0


async def _until(check: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# contract: JOB-01
async def test_each_freed_slot_is_claimed_while_another_claim_waits(store: tinystore.Store) -> None:
    q = store.queue("slots", dict)
    gates = {i: asyncio.Event() for i in range(4)}
    started: list[int] = []

    async def handler(value: dict[str, int], run: tinystore.Run) -> None:
        started.append(value["i"])
        await gates[value["i"]].wait()

    await q.add({"i": 0})
    await q.add({"i": 1})
    worker = q.work(handler, concurrency=2)
    try:

        async def both_started() -> bool:
            return sorted(started) == [0, 1]

        await _until(both_started, "both jobs to start")
        gates[0].set()  # one slot frees: a claim for it waits (the queue is empty)

        async def one_waiting() -> bool:
            return await _waiting_claims(store, "slots") == 1

        await _until(one_waiting, "a claim for the first free slot")
        gates[1].set()  # the other slot frees while that claim still waits: it gets a claim of its own

        async def two_waiting() -> bool:
            return await _waiting_claims(store, "slots") == 2

        await _until(two_waiting, "a second claim while the first still waits")
        gates[2].set()
        gates[3].set()
        await q.add({"i": 2})
        await q.add({"i": 3})

        async def all_ran() -> bool:
            return worker.ran == 4

        await _until(all_ran, "the two new jobs to run")
        assert sorted(started) == [0, 1, 2, 3]
    finally:
        await worker.stop()
    assert await _waiting_claims(store, "slots") == 0


# contract: JOB-01
async def test_a_worker_stopped_at_once_leaves_no_claim_behind(store: tinystore.Store) -> None:
    """stop() a few loop turns after work(): the worker's first claim may still be on its way to the store. It
    must not stay there, waiting, to take a job for a worker that is gone (the job flipped running and back,
    and with the store closed meanwhile was charged "worker lost" without ever running)."""
    q = store.queue("early", dict)
    await q.options()

    async def handler(value: dict[str, int], run: tinystore.Run) -> None:
        pass

    for turns in range(6):
        worker = q.work(handler, concurrency=2)
        for _ in range(turns):
            await asyncio.sleep(0)
        started = time.monotonic()
        await worker.stop(grace=0)
        assert time.monotonic() - started < 2.0
        assert await _waiting_claims(store, "early") == 0, f"a claim waits in the store after stop ({turns} turns)"
    jid = await q.add({"i": 1})
    await asyncio.sleep(0.2)
    job = await q.get(jid)
    assert job is not None and job.state == "queued" and job.attempts == 0 and job.started_at is None
