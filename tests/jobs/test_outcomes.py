"""How an attempt ends (permanent, flaky, ``run.retry``, ``run.snooze``, timeouts, sync handlers), and what
stopping a worker or cancelling a claim leaves behind."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, TypedDict

import msgspec
import pytest

import tinystore
import tinystore.protocol.jobs

from ..helpers import open_store
from .util import START, claim, other_client, wait_state, wait_until


@pytest.fixture(params=["embedded", "private"])
async def clocked(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store", clock=START) as s:
        yield s


async def drain(store: tinystore.Store, q: tinystore.Queue[Any], handler: Any, rounds: int = 8) -> int:
    """Run what is due, then move the test clock past the longest backoff, ``rounds`` times."""
    ran = 0
    for _ in range(rounds):
        ran += await q.run_due(handler)
        await store.clock.advance("5m")
    return ran


# contract: JOB-04
async def test_permanent_flaky_and_retry_attempt_counts(clocked: tinystore.Store) -> None:
    q = clocked.queue("outcomes", attempts=4)
    permanent = await q.add({"kind": "permanent"})
    flaky = await q.add({"kind": "flaky"})
    retried = await q.add({"kind": "retry"})
    snoozed = await q.add({"kind": "snooze"})
    runs: dict[str, int] = {}

    async def handler(value: dict[str, str], run: tinystore.Run) -> Any:
        kind = value["kind"]
        runs[kind] = runs.get(kind, 0) + 1
        if kind == "permanent":
            raise tinystore.PermanentError("not a PDF")
        if kind == "flaky":
            raise TimeoutError("the model API timed out")
        if kind == "retry":
            return run.retry()
        if runs[kind] <= 3:
            return run.snooze("1m")  # not an attempt
        return "done"

    await drain(clocked, q, handler)
    got = {jid: await q.get(jid) for jid in (permanent, flaky, retried, snoozed)}
    assert {k: (j.state, j.attempts) for k, j in got.items() if j} == {
        permanent: ("dead", 1),
        flaky: ("dead", 4),
        retried: ("dead", 4),
        snoozed: ("succeeded", 1),
    }
    assert runs == {"permanent": 1, "flaky": 4, "retry": 4, "snooze": 4}


async def test_a_handler_past_its_timeout_is_cancelled_and_retried(store: tinystore.Store) -> None:
    q = store.queue("timeouts", attempts=2, timeout="200ms", backoff=("1s", "1s"))
    jid = await q.add({})
    cancelled: list[int] = []

    async def handler(value: Any, run: tinystore.Run) -> str:
        if run.attempt == 1:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.append(run.attempt)
                raise
        return "fast enough"

    worker = q.work(handler)
    try:
        job = await wait_state(q, jid, "succeeded", timeout=10)
    finally:
        await worker.stop()
    assert cancelled == [1] and job.attempts == 2 and job.errors[0].error == "timed out after 0.2s"


async def test_sync_handlers_work(store: tinystore.Store) -> None:
    q = store.queue("sync")
    jid = await q.add({"a": 2})

    def handler(value: dict[str, int], run: tinystore.Run) -> int:
        run.set_progress({"done": 1})
        return value["a"] * 21

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert job is not None and (job.state, job.result, job.progress) == ("succeeded", 42, {"done": 1})


async def test_stopping_a_worker_hands_its_running_jobs_back_uncounted(store: tinystore.Store) -> None:
    q = store.queue("stops", attempts=1)
    jid = await q.add({})
    started = asyncio.Event()

    async def slow(value: Any, run: tinystore.Run) -> None:
        started.set()
        await asyncio.sleep(60)

    worker = q.work(slow)
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop(grace=0)
    job = await q.get(jid)
    assert job is not None and (job.state, job.attempts) == ("queued", 0)
    assert await q.run_due(lambda v, run: "ok") == 1
    job = await q.get(jid)
    assert job is not None and (job.state, job.attempts, job.result) == ("succeeded", 1, "ok")


async def test_a_worker_stop_lets_running_handlers_finish_within_grace(store: tinystore.Store) -> None:
    q = store.queue("graceful")
    jid = await q.add({})
    started = asyncio.Event()

    async def handler(value: Any, run: tinystore.Run) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "finished"

    worker = q.work(handler)
    await asyncio.wait_for(started.wait(), 5)
    await worker.stop(grace="5s")
    job = await q.get(jid)
    assert job is not None and (job.state, job.result) == ("succeeded", "finished")
    assert worker.ran == 1


async def test_a_cancelled_claim_leaves_no_job_claimed_by_nobody(store: tinystore.Store) -> None:
    q = store.queue("claims", lease="1h")
    await q.add({"warm": True})
    await q.run_due(lambda v, run: None)
    async with other_client(store) as other:
        waiting = asyncio.ensure_future(claim(other, "claims", wait=30))
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        jid = await q.add({"n": 1})
        await asyncio.sleep(0.2)
        job = await q.get(jid)
        assert job is not None and (job.state, job.attempts) == ("queued", 0)
        # many claims cancelled at random moments, racing adds: every job is still run exactly once
        ids = []
        for i in range(20):
            t = asyncio.ensure_future(claim(other, "claims", wait=30))
            ids.append(await q.add({"n": i}))
            await asyncio.sleep(0.001 * (i % 4))
            t.cancel()
            try:
                for c in await t:  # it won the race: it holds the job, so it reports it like a worker
                    await other._call(
                        "jobs.report",
                        tinystore.protocol.jobs.Report(queue="claims", id=c.id, fence=c.fence, outcome="succeeded"),
                        bool,
                        write=True,
                    )
            except asyncio.CancelledError:
                pass
    assert await q.run_due(lambda v, run: None) >= 1
    for i in [jid, *ids]:
        job = await wait_state(q, i, "succeeded", timeout=5)
        assert job.attempts == 1


async def test_watch_follows_a_job_to_its_end_without_polling(clocked: tinystore.Store) -> None:
    q = clocked.queue("watched", attempts=2, backoff=("10s", "10s"))
    jid = await q.add({})
    states: list[tuple[str, int]] = []

    async def follow() -> None:
        async for job in q.watch(jid):
            states.append((job.state, job.attempts))

    task = asyncio.ensure_future(follow())
    await wait_until(lambda: states, what="the first yield")

    async def fails(value: Any, run: tinystore.Run) -> None:
        raise RuntimeError("no")

    await q.run_due(fails)
    await clocked.clock.advance("11s")
    await q.run_due(lambda v, run: "yes")
    await asyncio.wait_for(task, 5)
    assert states[0] == ("queued", 0) and states[-1] == ("succeeded", 2)
    assert ("failed", 1) in states
    assert [s async for s in q.watch("unknown")] == []


class Page(TypedDict):
    url: str
    depth: int


class Chunk(msgspec.Struct):
    doc_id: str
    position: int


@dataclasses.dataclass
class Summary:
    chat_id: int
    words: list[str]


async def test_typed_values_round_trip(store: tinystore.Store) -> None:
    cases: list[tuple[str, Any, Any]] = [
        ("typed-dict", Page, Page(url="https://wiki/x", depth=2)),
        ("struct", Chunk, Chunk("d-1", 7)),
        ("dataclass", Summary, Summary(3, ["a", "b"])),
        ("plain", list[int], [1, 2, 3]),
        ("any", None, {"nested": [1, {"ü": "😀"}]}),
    ]
    for name, type_, value in cases:
        q = store.queue(name, type_)
        jid = await q.add(value)
        got: list[Any] = []
        assert await q.run_due(lambda v, run, got=got: got.append(v)) == 1
        job = await q.get(jid)
        assert got == [value] and job is not None and job.value == value, name


async def test_closing_the_store_stops_its_workers(tmp_path: Path) -> None:
    d = tmp_path / "store"
    async with open_store("embedded", d) as store:
        q = store.queue("closing")
        jid = await q.add({})
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> str:
            started.set()
            await asyncio.sleep(0.3)
            return "finished before the close"

        worker = q.work(handler)
        await asyncio.wait_for(started.wait(), 5)
    assert worker.running == 0
    async with open_store("embedded", d) as store:
        job = await store.queue("closing").get(jid)
        assert job is not None and (job.state, job.result) == ("succeeded", "finished before the close")


# contract: JOB-10
async def test_progress_is_sent_at_most_ten_times_a_second(store: tinystore.Store) -> None:
    q = store.queue("chatty")
    events: list[tinystore.JobEvent] = []
    sub = await (
        store.channel("tinystore-jobs", tinystore.JobEvent)
        .under("chatty")
        .subscribe(lambda m: events.append(m.value) if m.value.kind == "progress" else None, recursive=True)
    )
    jid = await q.add({})

    async def handler(value: Any, run: tinystore.Run) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + 0.5
        n = 0
        while loop.time() < end:
            n += 1
            run.set_progress({"done": n})
            await asyncio.sleep(0.001)
        run.set_progress({"done": "all"})

    try:
        assert await q.run_due(handler) == 1
        job = await q.get(jid)
        assert job is not None and job.progress == {"done": "all"}  # the last value went with the end
        await asyncio.sleep(0.2)
        assert 3 <= len(events) <= 7, [e.progress for e in events]
    finally:
        await sub.stop()


# contract: JOB-03
async def test_an_embedded_test_clock_moves_a_handlers_timeout(tmp_path: Path) -> None:
    """A test of "a hanging handler is cancelled at its timeout" needs no real wait: in an embedded store the
    handler's timeout follows the test clock, as the store's leases, backoffs and ``expected`` do (trial Z: it ran
    on real time only)."""
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("hangs", attempts=2, timeout="1m", expected="10m", backoff=("1s", "1s"))
        jid = await q.add({})
        started = asyncio.Event()
        cancelled: list[int] = []

        async def handler(value: Any, run: tinystore.Run) -> str:
            if run.attempt == 1:
                started.set()
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancelled.append(run.attempt)
                    raise
            return "done"

        worker = q.work(handler)
        try:
            await asyncio.wait_for(started.wait(), 10)
            store.clock.advance("30s")
            await asyncio.sleep(0.05)
            assert cancelled == []  # not yet
            store.clock.advance("31s")
            await wait_until(lambda: cancelled == [1], timeout=5, what="the handler was cancelled at its timeout")
            await wait_until(lambda: _failed(q, jid), timeout=5, what="the attempt failed")
            store.clock.advance("2s")  # the backoff
            job = await wait_state(q, jid, "succeeded", timeout=5)
        finally:
            await worker.stop()
        assert job.attempts == 2 and job.errors[0].error == "timed out after 60s"


async def _failed(q: tinystore.Queue[Any], jid: str) -> bool:
    job = await q.get(jid)
    return job is not None and job.state == "failed"


async def test_watch_raises_unavailable_once_the_store_stays_away_past_reconnect_timeout(tmp_path: Path) -> None:
    """Trial AC: with the server down for 40 s and reconnect_timeout=3, every other call raised at 3 s, and watch
    went on silently for the whole 40 s (its docstring said it raises when the store stays unreachable)."""
    import time

    from ..helpers import ServerProcess

    server = ServerProcess(tmp_path / "s").start()
    store = await tinystore.open(tmp_path / "s", reconnect_timeout=1.0)
    try:
        q = store.queue("w", dict)
        job = await q.add({})
        watching = q.watch(job)
        assert (await anext(watching)).state == "queued"
        server.kill()
        start = time.monotonic()
        with pytest.raises(tinystore.UnavailableError):
            await asyncio.wait_for(anext(watching), 10)
        assert time.monotonic() - start < 5
    finally:
        await store.close()
        server.stop()
