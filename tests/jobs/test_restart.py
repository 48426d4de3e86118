"""Server stops and restarts under working workers (JOB-01, JOB-02)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import ServerProcess, drop_connection, open_store
from .util import wait_state


# contract: JOB-02
async def test_a_graceful_stop_does_not_wait_for_waiting_workers_and_they_resume(tmp_path: Path) -> None:
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    store = await tinystore.open(d)
    ran: list[int] = []

    async def handler(value: dict[str, int], run: tinystore.Run) -> None:
        ran.append(value["n"])

    try:
        q = store.queue("resume")
        worker = q.work(handler, concurrency=2)
        first = await q.add({"n": 1})
        await wait_state(q, first, "succeeded")
        await asyncio.sleep(0.2)  # the worker's claims now wait in the server
        began = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - began < 5
        server = ServerProcess(d).start()
        await store.status()  # a read is sent again once the SDK reconnected to the new server
        second = await q.add({"n": 2})
        await wait_state(q, second, "succeeded", timeout=15)
        assert ran == [1, 2]
        await worker.stop()
    finally:
        await store.close()
        server.stop()


# contract: JOB-01
async def test_a_running_attempt_survives_a_server_restart_when_its_worker_lives(tmp_path: Path) -> None:
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    store = await tinystore.open(d)
    started = asyncio.Event()
    finish = asyncio.Event()

    async def handler(value: Any, run: tinystore.Run) -> int:
        started.set()
        await finish.wait()
        return run.attempt

    try:
        q = store.queue("survive", lease="2s", attempts=3)
        jid = await q.add({})
        worker = q.work(handler)
        await asyncio.wait_for(started.wait(), 5)
        server.kill(signal.SIGKILL)
        server = ServerProcess(d).start()
        await asyncio.sleep(3.0)  # more than a lease: the worker reconnected and renewed
        await store.status()
        job = await q.get(jid)
        assert job is not None and (job.state, job.attempts) == ("running", 1)
        finish.set()
        job = await wait_state(q, jid, "succeeded", timeout=10)
        assert (job.attempts, job.result, job.errors) == (1, 1, [])
        await worker.stop()
    finally:
        await store.close()
        server.stop()


# contract: JOB-01
@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_workers_ride_through_a_dropped_connection(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "store") as store:
        q = store.queue("drops", lease="2s")
        started = asyncio.Event()
        finish = asyncio.Event()

        async def handler(value: dict[str, int], run: tinystore.Run) -> int:
            if value["n"] == 1:
                started.set()
                await finish.wait()
            return value["n"]

        worker = q.work(handler, concurrency=2)
        try:
            first = await q.add({"n": 1})
            await asyncio.wait_for(started.wait(), 5)
            drop_connection(store)  # the claim waiting for a second job and the running attempt's lease
            await asyncio.sleep(0.5)
            finish.set()
            job = await wait_state(q, first, "succeeded", timeout=10)
            assert (job.attempts, job.result) == (1, 1)
            drop_connection(store)  # an idle worker's waiting claim
            await store.status()
            second = await q.add({"n": 2})
            job = await wait_state(q, second, "succeeded", timeout=10)
            assert (job.attempts, job.result) == (1, 2)
        finally:
            await worker.stop()


# contract: JOB-01
async def test_a_renewal_that_comes_before_its_queue_is_loaded_keeps_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that just started loads its queues in the background; a worker that reconnected first and renews
    its running attempt must not be told the attempt is lost (its handler would be cancelled, the job failed
    "worker lost" though the worker lives). Here the background load never runs: the renewal loads the queue."""
    import sqlite3

    from tinystore.engines.jobs import JOBS_DB, TABLE, JobsEngine
    from tinystore.protocol.jobs import Attempt, Renew

    d = tmp_path / "store"
    store = await tinystore.open(d, embedded=True)
    try:
        jid = await store.queue("early", lease="30s").add({})
    finally:
        await store.close()
    # what a server killed while a remote worker ran the job leaves: the attempt running, with a lease
    now_ms = int(time.time() * 1000)
    with sqlite3.connect(d / "sql" / f"{JOBS_DB}.db") as conn:
        conn.execute(
            f"update {TABLE} set state = 'running', attempts = 1, fence = 1, started_at = ?, lease_until = ? "
            "where id = ?",
            [now_ms, now_ms + 30_000, jid],
        )
    conn.close()

    async def not_loading(self: JobsEngine) -> None:
        return None

    monkeypatch.setattr(JobsEngine, "start", not_loading)
    store = await tinystore.open(d, embedded=True)
    try:
        renew = Renew(queue="early", attempts=[Attempt(jid, 1), Attempt(jid, 7), Attempt("nope", 1)])
        lost = await store._call("jobs.renew", renew, list[str], write=True)
        assert lost == [jid, "nope"]  # the current attempt is kept; a wrong fence and an unknown id are lost
        job = await store.queue("early", lease="30s").get(jid)
        assert job is not None and (job.state, job.attempts) == ("running", 1)
        gone = await store._call("jobs.renew", Renew(queue="no-such-queue", attempts=[Attempt(jid, 1)]), list[str])
        assert gone == [jid]
    finally:
        await store.close()


# contract: JOB-02
async def test_a_queue_of_many_jobs_loads_whole_after_a_restart(tmp_path: Path) -> None:
    # from trial AO: the load of a big queue held the event loop for seconds (now it yields every 10,000 jobs),
    # and its read was held to sql_result_bytes, which a queue of millions of jobs is over (now it is not)
    from tinystore.engines import jobs as jobs_engine

    limits = tinystore.Limits(sql_result_bytes=1 << 20)  # the jobs' rows are over it: the load is not held to it
    async with open_store("embedded", tmp_path / "s", limits=limits) as store:
        q = store.queue("later")
        for i in range(25):
            await q.add_many([{"i": i * 1000 + j} for j in range(1000)], delay="1h")
        first = await q.add("soon")
    assert jobs_engine.LOAD_SLICE < 25_001
    async with open_store("embedded", tmp_path / "s", limits=limits) as store:
        q = store.queue("later")
        page = await q.list(limit=5)  # (a read: it does not wait for the load)
        assert len(page.jobs) == 5
        got = await q.run_due(lambda value, run: None)  # (a claim: it does)
        assert got == 1 and (await q.get(first)).state == "succeeded"  # type: ignore[union-attr]
        status = (await store.status())["jobs"]["queues"]
        (later,) = [s for s in status if s["queue"] == "later"]
        assert later["queued"] + later.get("delayed", 0) == 25_000, later


# contract: JOB-02
# contract: LOCK-07
@pytest.mark.parametrize("how", ["block", "task_group", "own"])
async def test_an_attempt_whose_lock_ends_with_a_graceful_stop_is_not_counted(tmp_path: Path, how: str) -> None:
    # trial GN: a graceful stop ends every lease of a lock (LOCK-07), so a handler holding one raised LostError and
    # its attempt counted as failed: a few restarts during one job made it dead. Trial GP: so too in a TaskGroup's
    # task; and a LostError of the handler's own, raised as the store stops, is counted as any raise
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    store = await tinystore.open(d)
    attempts: list[int] = []
    lost: list[str] = []

    async def hold() -> None:
        try:
            async with store.semaphore("cpu", limit=2).hold("acme"):
                await asyncio.sleep(30)  # the stop ends the lease: LostError
        except tinystore.LostError as exc:
            lost.append(exc.message)
            if how == "own":
                raise tinystore.LostError("the handler's own") from None
            raise

    async def handler(value: Any, run: tinystore.Run) -> int:
        attempts.append(run.attempt)
        if len(attempts) == 1:
            if how == "task_group":
                async with asyncio.TaskGroup() as group:
                    group.create_task(hold())
            else:
                await hold()
        return run.attempt

    try:
        q = store.queue("held", attempts=1)  # (one failed attempt would make it dead)
        jid = await q.add({})
        worker = q.work(handler)
        while not attempts:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # (the semaphore held)
        assert server.stop() == 0
        server = ServerProcess(d).start()
        if how == "own":
            job = await wait_state(q, jid, "dead", timeout=15)
            assert attempts == [1] and "the handler's own" in job.errors[-1].error
        else:
            job = await wait_state(q, jid, "succeeded", timeout=15)
            assert attempts == [1, 1] and (job.attempts, job.result, job.errors) == (1, 1, [])
        assert lost and "the store is stopping" in lost[0]
        await worker.stop()
    finally:
        await store.close()
        server.stop()
