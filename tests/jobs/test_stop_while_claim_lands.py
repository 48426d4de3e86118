"""From trial AG2: a worker stopped in the one loop turn between its claim's commit and the claim task's resuming
hands back every attempt it got, even though the stop cancels that task meanwhile. An embedded store's own
workers have no lease: an attempt not handed back would stay running for ever."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.engines.jobs_index import CLAIMING, RUNNING

from ..helpers import open_store
from .util import START


# contract: JOB-01
async def test_a_stop_as_a_claim_of_several_lands_hands_every_attempt_back(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "store", clock=START) as store:
        q = store.queue("q", timeout="5s", lease="3s", expected="2s")
        await q.options()
        index = await store._core.engines["jobs"]._queue("q")  # read only: to time the stop

        async def handler(value: Any, run: tinystore.Run) -> None:
            await asyncio.sleep(20)

        worker = q.work(handler, concurrency=5)
        await asyncio.sleep(0.2)  # the worker's claim waits in the store
        ids = await q.add_many([1, 2, 3, 4, 5])
        for _ in range(10_000):
            if any(e.where == RUNNING for e in index.entries.values()):
                break  # the claim's write has committed; the claim task has not resumed yet
            await asyncio.sleep(0)
        await worker.stop(grace="0.5s")
        assert worker.running == 0
        await asyncio.sleep(0.2)  # (a hand-back cut short would leave its jobs running here, and for ever)
        states = [(await q.get(i)).state for i in ids]  # type: ignore[union-attr]
        assert states == ["queued"] * 5
        status = (await store.status())["jobs"]["queues"][0]
        assert (status["running"], status["queued"]) == (0, 5)


# contract: JOB-01
async def test_the_jobs_of_a_stopped_worker_are_queued_when_stop_returns(tmp_path: Path) -> None:
    # stopped while its claim's write is on its way (CLAIMING) or just landed (RUNNING): once stop() returns, the
    # status and every job say what happened, with no hand-back still under way behind it
    async with open_store("embedded", tmp_path / "store", clock=START) as store:
        q = store.queue("q", timeout="5s", lease="3s", expected="2s")
        await q.options()
        index = await store._core.engines["jobs"]._queue("q")  # read only: to time the stop

        async def handler(value: Any, run: tinystore.Run) -> None:
            await asyncio.sleep(20)

        for where in (CLAIMING, RUNNING):
            worker = q.work(handler, concurrency=5)
            await asyncio.sleep(0.2)  # the worker's claim waits in the store
            adding = asyncio.ensure_future(q.add_many([1, 2, 3, 4, 5]))
            for _ in range(10_000):
                if any(e.where == where for e in index.entries.values()):
                    break
                await asyncio.sleep(0)
            else:
                raise AssertionError(f"no job was seen {where}")
            await worker.stop(grace="0.5s")
            ids = await adding
            status = (await store.status())["jobs"]["queues"][0]
            assert (status["running"], status["queued"]) == (0, 5), where
            states = [(await q.get(i)).state for i in ids]  # type: ignore[union-attr]
            assert states == ["queued"] * 5, where
            for i in ids:
                await q.cancel(i)


# contract: JOB-01
@pytest.mark.parametrize("mode", ["private", "tcp"])
async def test_over_a_socket_the_jobs_of_a_stopped_worker_are_queued_when_stop_returns(
    tmp_path: Path, mode: str
) -> None:
    # from trial AR: over a socket the claim's cancel and its hand-back by token reached the server while the
    # claim's write was on its way: the hand-back found nothing yet, stop() returned, and the jobs said running,
    # attempt 1, until the claim landed (a third of the rounds). The hand-back waits for the claim to land now.
    async with open_store(mode, tmp_path / "store") as store:
        wrong = []
        started: list[Any] = []

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.append(value)
            await asyncio.sleep(20)

        for i in range(30):
            q = store.queue(f"q{i}")
            ids = await q.add_many([1, 2, 3])
            started.clear()

            worker = q.work(handler, concurrency=3)
            await asyncio.sleep(0)  # its claim is on its way
            await worker.stop(grace=0)
            jobs = [await q.get(j) for j in ids]
            if started:
                continue  # (a handler began: its attempt counted, as documented)
            wrong += [(i, j.state, j.attempts) for j in jobs if j is None or j.state != "queued" or j.attempts != 0]
        assert wrong == []


# contract: JOB-01
async def test_a_workers_stop_does_not_wait_for_a_server_that_is_gone(tmp_path: Path) -> None:
    # from trial AW: the claim cancelled by the stop, never sent (the server was killed and the SDK waits for it),
    # waited 10 s for a hand-back it could not send: stop() took 5 s. A store that is gone leaves the attempts
    # to their leases (Worker.stop)
    import signal
    import time

    from ..helpers import ServerProcess

    server = ServerProcess(tmp_path / "store").start()
    assert server.proc is not None
    try:
        store = await tinystore.open(tmp_path / "store")
        try:
            q = store.queue("q")

            async def handler(value: Any, run: tinystore.Run) -> None:
                return None

            worker = q.work(handler, concurrency=2)
            await asyncio.sleep(1.0)  # its claim waits in the store
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait()
            await asyncio.sleep(1.0)  # the SDK saw it go; the worker claims again, waiting for it to come back
            started = time.monotonic()
            await asyncio.wait_for(worker.stop(), 30)
            assert time.monotonic() - started < 3
        finally:
            await store.close()
    finally:
        server.stop()


# contract: JOB-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_an_attempt_stopped_before_its_task_first_ran_is_handed_back(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from trial BU (and a CI run under load): the stop cancelled an attempt's task in the loop turn it was made, so
    # its code never ran (a task cancelled before its first step runs none of it) and nothing handed the job back:
    # stop() returned with it running, attempt 1, until its lease ran out. Here the stop comes in that very turn
    from tinystore.client import jobs as client_jobs

    start = client_jobs._Runner.start
    ran: list[Any] = []
    stopped = asyncio.Event()

    def start_then_stop(self: Any, claimed: Any, sent: float | None = None) -> Any:
        a = start(self, claimed, sent)
        a.stop("stopping")  # as a worker's stop() does when it comes in the same loop turn
        stopped.set()
        return a

    async with open_store(mode, tmp_path / "store") as store:
        q = store.queue("q")
        jid = await q.add(1)
        monkeypatch.setattr(client_jobs._Runner, "start", start_then_stop)
        worker = q.work(lambda value, run: ran.append(value), concurrency=1)
        await asyncio.wait_for(stopped.wait(), 10)
        await worker.stop(grace=0)
        job = await q.get(jid)
        assert ran == [] and job is not None and (job.state, job.attempts) == ("queued", 0)


# contract: JOB-01
async def test_a_hand_back_by_token_waits_for_the_hand_back_of_a_claim_given_up_as_it_landed(tmp_path: Path) -> None:
    # from the CI run of 4a90b2d (the test above, over TCP, 1 run in 5): the claim was cancelled while its write
    # was on its way; its write landed and it began handing its jobs back itself; the client's hand-back by token
    # came meanwhile, found the claim no longer on its way and nothing kept for its token, and answered 0 at
    # once. stop() returned with the jobs still running, attempt 1, for the moment that hand-back took.
    from tinystore.protocol.jobs import Claim, ReleaseClaim

    async with open_store("embedded", tmp_path / "store", clock=START) as store:
        q = store.queue("q", timeout="5s", lease="3s", expected="2s")
        ids = await q.add_many([1, 2, 3])
        core = store._core
        session = store.transport.session  # type: ignore[attr-defined]
        index = await core.engines["jobs"]._queue("q")  # read only: to time the calls
        claiming = asyncio.ensure_future(
            core.call(session, "jobs.claim", Claim(queue="q", n=3, wait_ms=1000, worker="w", token="t-1"))
        )
        for _ in range(10_000):
            if any(e.where == CLAIMING for e in index.entries.values()):
                break
            await asyncio.sleep(0)
        else:
            raise AssertionError("the claim was never seen on its way")
        claiming.cancel()  # given up while its write is on its way: it hands back what it gets once it lands
        # (up to 10 s, looking at every loop turn: 10,000 turns were over before the writer's thread wrote, on a
        # loaded machine)
        deadline = time.monotonic() + 10
        while not any(e.where == RUNNING for e in index.entries.values()):  # landed: its hand-back has begun
            if time.monotonic() > deadline:
                raise AssertionError("the claim never landed")
            await asyncio.sleep(0)
        await core.call(session, "jobs.release_claim", ReleaseClaim(queue="q", token="t-1"))
        assert [e.where for e in index.entries.values() if e.where == RUNNING] == []
        states = [(await q.get(i)).state for i in ids]  # type: ignore[union-attr]
        assert states == ["queued"] * 3
        with pytest.raises(asyncio.CancelledError):
            await claiming


# contract: JOB-08
async def test_a_claim_that_waited_for_its_queue_s_load_says_so_in_waited_ms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial FD: after a start, a claim waits for its queue's jobs to load; waited_ms counted from after the load,
    and a healthy worker (which counts its lease from its claim's writing + waited_ms) dropped the claim's attempts
    as past their lease: with attempts=1, dead, worker lost."""
    from tinystore.engines.jobs import JobsEngine
    from tinystore.protocol.jobs import Claim

    async with open_store("embedded", tmp_path / "store") as store:
        q = store.queue("q", lease="1s")
        await q.add(1)
        engine = store._core.engines["jobs"]
        load = JobsEngine._queue

        async def slow_load(self: Any, name: str) -> Any:
            await asyncio.sleep(1.0)  # (as a queue of some 300,000 jobs loads at a start)
            return await load(self, name)

        monkeypatch.setattr(JobsEngine, "_queue", slow_load)
        got = await engine.claim(store.transport.session, Claim(queue="q", n=1, wait_ms=0, worker="w", token="t"))  # type: ignore[attr-defined]
        assert len(got) == 1 and got[0].waited_ms is not None and got[0].waited_ms >= 1000, got
