"""Fair scheduling under load (JOB-07): one tenant's backlog never starves another tenant's job."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import ServerProcess
from .util import wait_until


# contract: JOB-07
@pytest.mark.slow
async def test_a_tenants_thousand_jobs_do_not_delay_anothers_job(tmp_path: Path) -> None:
    """Four workers (four clients of one server), ``max_running_per_tenant=2``: tenant A adds 1,000 jobs of
    50 ms, then tenant B adds one. B's job starts within 1 s, A never has more than 2 running, and all of A's
    finish (A alone can run at most 2 at a time: about 25 s)."""
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    clients = [await tinystore.open(d) for _ in range(4)]
    running: dict[str, int] = {"A": 0, "B": 0}
    most = {"A": 0, "B": 0}
    started: dict[str, float] = {}
    finished = {"A": 0, "B": 0}

    async def handler(value: dict[str, Any], run: tinystore.Run) -> None:
        t = run.tenant
        running[t] += 1
        most[t] = max(most[t], running[t])
        if t == "B":
            started["B"] = time.monotonic()
        try:
            await asyncio.sleep(0.05)
        finally:
            running[t] -= 1
        finished[t] += 1

    try:
        queues = [c.queue("work", max_running_per_tenant=2) for c in clients]
        workers = [q.work(handler) for q in queues]
        await queues[0].add_many([{"n": i} for i in range(1000)], tenant="A")
        await wait_until(lambda: finished["A"] >= 20, what="A's jobs running")
        added = time.monotonic()
        await queues[1].add({"n": 0}, tenant="B")
        await wait_until(lambda: "B" in started, timeout=5, what="B's job started")
        assert started["B"] - added < 1.0
        await wait_until(lambda: finished["A"] == 1000, timeout=90, what="all of A's jobs finished")
        for w in workers:
            await w.stop()
        assert most == {"A": 2, "B": 1}
        assert finished == {"A": 1000, "B": 1}
        page = await queues[0].list(state="succeeded", limit=1000)
        assert len(page.jobs) == 1000 and page.next is not None
    finally:
        for c in clients:
            await c.close()
        server.stop()


# contract: JOB-07
@pytest.mark.parametrize("cap", [2, 3])
async def test_a_tenant_under_its_cap_keeps_priority_over_a_lower_one(store: tinystore.Store, cap: int) -> None:
    """From trial DL: with max_running_per_tenant, a worker's next claim (sent after its report) came while the
    finished attempt's end was being written, and counted it as running: the tenant seemed at its cap, and a job
    of lower priority of another tenant ran before the tenant's own (A0, A1, A2, LO, A3, ...)."""
    queue = store.queue("f", max_running_per_tenant=cap)
    order: list[str] = []

    async def handler(value: str, run: Any) -> None:
        order.append(value)
        await asyncio.sleep(0.02)

    await queue.add_many([f"A{i}" for i in range(8)], tenant="A")
    await queue.add("LO", tenant="Z", priority=-1)
    worker = queue.work(handler, concurrency=2)
    try:
        await wait_until(lambda: len(order) == 9, what="all nine jobs run")
    finally:
        await worker.stop()
    assert order[-1] == "LO", order


# contract: JOB-07
async def test_a_cancelled_job_holds_its_slot_until_its_handler_is_told(store: tinystore.Store) -> None:
    """From trial DN: with max_running=1 and two workers, a cancel of the running job let the other worker's
    waiting claim start the next job before the cancelled handler had heard of its cancel (two ran at once)."""
    queue = store.queue("one", max_running=1)
    spans: dict[str, list[float]] = {}
    started = asyncio.Event()

    async def handler(value: str, run: Any) -> None:
        spans[value] = [time.monotonic()]
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            spans[value].append(time.monotonic())

    first = await queue.add("first")
    await queue.add("second")
    workers = [queue.work(handler, concurrency=1), queue.work(handler, concurrency=1)]
    try:
        await asyncio.wait_for(started.wait(), 10)
        assert list(spans) == ["first"]
        await asyncio.sleep(0.2)  # (the other worker's claim waits in the store)
        assert await queue.cancel(first)
        await wait_until(lambda: "second" in spans, what="the second job to start")
        assert len(spans["first"]) == 2, "the second job started before the cancelled handler was told"
        assert spans["first"][1] <= spans["second"][0]
    finally:
        for w in workers:
            await w.stop(grace=0)
