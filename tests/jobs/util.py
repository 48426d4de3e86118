"""Helpers of the jobs tests: raw claims from a second client, waiting for a job's state, test clocks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import tinystore
from tinystore.protocol.jobs import Attempt, Claimed, Progress, Report, Step

START = datetime(2030, 1, 1, 12, 0, 0)
"""Where the tests' test clocks start."""


@contextlib.asynccontextmanager
async def other_client(store: tinystore.Store) -> AsyncIterator[tinystore.Store]:
    """A second client of the same store, over its socket (so its attempts have leases, even beside an
    embedded store)."""
    assert store.directory is not None
    other = await tinystore.open(store.directory)
    try:
        yield other
    finally:
        await other.close()


async def claim(store: tinystore.Store, queue: str, n: int = 1, wait: float = 2.0) -> list[Claimed]:
    """Claim attempts as a worker would, without running anything (a worker that then freezes or dies)."""
    from tinystore.client.jobs import claim as sdk_claim

    return await sdk_claim(store, queue, n, wait, "test")


async def report(store: tinystore.Store, queue: str, c: Claimed, outcome: str = "succeeded", **kw: Any) -> bool:
    ok: bool = await store._call(
        "jobs.report", Report(queue=queue, id=c.id, fence=c.fence, outcome=outcome, **kw), bool, write=True
    )
    return ok


async def progress(store: tinystore.Store, queue: str, c: Claimed, value: str) -> bool:
    ok: bool = await store._call("jobs.progress", Progress(queue=queue, id=c.id, fence=c.fence, progress=value), bool)
    return ok


async def step(store: tinystore.Store, queue: str, c: Claimed, name: str, value: str) -> bool:
    ok: bool = await store._call("jobs.step", Step(queue=queue, id=c.id, fence=c.fence, name=name, result=value), bool)
    return ok


async def renew(store: tinystore.Store, queue: str, c: Claimed) -> list[str]:
    from tinystore.protocol.jobs import Renew

    lost: list[str] = await store._call("jobs.renew", Renew(queue=queue, attempts=[Attempt(c.id, c.fence)]), list[str])
    return lost


async def wait_state(q: tinystore.Queue[Any], job_id: str, *states: str, timeout: float = 10.0) -> tinystore.Job[Any]:
    """Poll until job ``job_id`` is in one of ``states`` (tests only: the SDK itself never polls)."""
    deadline = time.monotonic() + timeout
    while True:
        job = await q.get(job_id)
        assert job is not None, f"job {job_id} is gone"
        if job.state in states:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {job.state} (attempts {job.attempts}), not {states}")
        await asyncio.sleep(0.01)


async def wait_until(cond: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout}s")
        await asyncio.sleep(0.01)
