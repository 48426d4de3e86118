"""Workers killed with SIGKILL or frozen with SIGSTOP while they run a job (JOB-01, JOB-03, JOB-08).

The store is a ``tinystore serve`` process; the workers are other processes (``tests/jobs/worker_proc.py``)
with short leases (1 s) and backoffs (100 ms) so the tests run in seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import ServerProcess, open_store
from .procs import WorkerProcess, starts
from .util import wait_state, wait_until

OPTIONS: dict[str, Any] = {"attempts": 3, "lease": "1s", "backoff": ("100ms", "100ms")}
EFFECTS = [("001.sql", "create table effects (job_id text primary key, fence integer not null, pid integer);")]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Path, tinystore.Store]]:
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    store = await tinystore.open(d)
    try:
        await store.database("app", migrations=EFFECTS)
        yield d, store
    finally:
        await store.close()
        server.stop()


# contract: JOB-01
async def test_a_job_of_a_killed_worker_runs_again_elsewhere(served: tuple[Path, tinystore.Store]) -> None:
    d, store = served
    q = store.queue("crash", **OPTIONS)
    await q.add({"n": 1})  # opens the queue with its options
    log = d.parent / "crash.log"
    a = await WorkerProcess(d, "crash", "hang", log).start()
    b: WorkerProcess | None = None
    try:
        jid = (await q.list()).jobs[0].id
        await wait_until(lambda: len(starts(log)) == 1, what="worker A started the job")
        await a.kill()  # SIGKILL while the handler runs
        b = await WorkerProcess(d, "crash", "ok", log).start()
        job = await wait_state(q, jid, "succeeded", timeout=15)
    finally:
        await a.stop()
        if b is not None:
            await b.stop()
    assert [(s[1], s[3]) for s in starts(log)] == [(1, a.pid), (2, b.pid)]
    assert (job.attempts, [e.error for e in job.errors], job.result) == (2, ["worker lost"], {"pid": b.pid})


# contract: JOB-03
async def test_a_handler_that_kills_its_worker_every_time_ends_dead_after_exactly_attempts(
    served: tuple[Path, tinystore.Store],
) -> None:
    d, store = served
    q = store.queue("killer", **OPTIONS)
    jid = await q.add({"n": 1})
    log = d.parent / "killer.log"
    for _ in range(10):  # a supervisor that restarts the worker each time it dies
        job = await q.get(jid)
        assert job is not None
        if job.state == "dead":
            break
        w = await WorkerProcess(d, "killer", "kill", log).start()
        try:
            await wait_until(lambda w=w: not w.alive(), timeout=15, what="the worker died")
        finally:
            await w.stop()
        await wait_until(lambda: _settled(q, jid), timeout=15, what="the lease ran out")
    job = await wait_state(q, jid, "dead", timeout=15)
    assert (job.attempts, [e.error for e in job.errors]) == (3, ["worker lost"] * 3)
    assert [s[1] for s in starts(log)] == [1, 2, 3]
    # never redelivered: a worker that stays finds nothing to do
    w = await WorkerProcess(d, "killer", "kill", log).start()
    try:
        await asyncio.sleep(1.5)
        assert w.alive()
    finally:
        await w.stop()
    assert len(starts(log)) == 3


async def _settled(q: tinystore.Queue[Any], jid: str) -> bool:
    job = await q.get(jid)
    return job is not None and job.state in ("failed", "dead", "queued")


# contract: JOB-08
async def test_a_frozen_worker_loses_its_job_and_its_late_completion_is_refused(
    served: tuple[Path, tinystore.Store],
) -> None:
    d, store = served
    q = store.queue("freeze", **OPTIONS)
    db = await store.database("app")
    jid = await q.add({"sleep": 2.0})
    log = d.parent / "freeze.log"
    a = await WorkerProcess(d, "freeze", "effect", log).start()
    b: WorkerProcess | None = None
    try:
        await wait_until(lambda: len(starts(log)) == 1, what="worker A started the job")
        a.signal(signal.SIGSTOP)  # frozen: no renewal, no report
        await wait_state(q, jid, "failed", "queued", timeout=10)
        b = await WorkerProcess(d, "freeze", "effect", log).start()
        job = await wait_state(q, jid, "succeeded", timeout=15)
        a.signal(signal.SIGCONT)  # A wakes up past its lease: whatever it reports changes nothing
        await asyncio.sleep(3.0)
    finally:
        await a.stop()
        if b is not None:
            await b.stop()
    after = await q.get(jid)
    assert after == job
    assert (job.attempts, job.result, [e.error for e in job.errors]) == (2, {"pid": b.pid}, ["worker lost"])
    rows = await db.all("select job_id, fence, pid from effects")
    assert rows == [{"job_id": jid, "fence": job.fence, "pid": b.pid}]
    late = [line for line in log.read_text().splitlines() if line.startswith("effect") and line.endswith(" 1")]
    assert len(late) == 1  # only the current attempt's effect was applied


# contract: JOB-08
async def test_a_claim_answered_to_a_frozen_worker_past_its_lease_is_not_run(
    served: tuple[Path, tinystore.Store],
) -> None:
    """Trial FA: a worker frozen (SIGSTOP) while its claim waited in the store was handed a job; the lease ran out
    and the job ended dead (one attempt), and on SIGCONT the worker ran the handler whole, its fenced write taken
    (no later attempt's fence was above it)."""
    d, store = served
    q = store.queue("paused", attempts=1, lease="1s")
    db = await store.database("app")
    await q.add({"sleep": 0}, delay="1h")  # (opens the queue with its options)
    log = d.parent / "paused.log"
    a = await WorkerProcess(d, "paused", "effect", log).start()
    try:
        await asyncio.sleep(0.5)  # its claim waits in the store
        a.signal(signal.SIGSTOP)
        jid = await q.add({"sleep": 0})  # handed to the frozen worker's claim
        job = await wait_state(q, jid, "dead", timeout=10)
        a.signal(signal.SIGCONT)  # it reads the claim's answer now, past the lease
        await asyncio.sleep(1.5)
    finally:
        await a.stop()
    assert starts(log) == [], log.read_text()  # the handler never ran
    assert await db.all("select * from effects") == []
    assert (await q.get(jid)) == job and [e.error for e in job.errors] == ["worker lost"]


# contract: JOB-01
async def test_claims_that_waited_their_turn_in_the_client_all_run(tmp_path: Path) -> None:
    """Trial FB: the check above counted a claim's lease from before the call, not from its writing: a connection
    parks at most 160 claims in the store, the rest wait in the client for a turn, and those were dropped as past
    their lease (their jobs dead, worker lost) though the store had just granted them."""
    async with open_store("private", tmp_path / "store") as store:
        ran: list[Any] = []

        async def handler(value: Any, run: tinystore.Run) -> None:
            ran.append(value)

        queues = [store.queue(f"q{i}", lease="1s", attempts=1) for i in range(165)]
        workers = [q.work(handler) for q in queues]
        try:
            await asyncio.sleep(1.5)  # (the claims past 160 wait in the client longer than a lease)
            await asyncio.gather(*(q.add(i) for i, q in enumerate(queues)))
            await wait_until(lambda: len(ran) == 165, timeout=15, what="every job ran")
        finally:
            await asyncio.gather(*(w.stop() for w in workers))
        states = [j.state for q in queues for j in (await q.list()).jobs]
        assert states == ["succeeded"] * 165


# contract: JOB-08
async def test_an_attempt_whose_handler_could_not_start_within_its_lease_is_not_run(tmp_path: Path) -> None:
    """Trial FB: the check was made as the claim came, not as the handler starts: a loop blocked (or a process
    paused) in between let a handler begin after the store had ended its attempt."""
    import time

    async with open_store("private", tmp_path / "store") as store:
        q = store.queue("blocked", lease="1s", attempts=1)
        first, second = await q.add(1), await q.add(2)
        started: list[int] = []

        async def handler(value: int, run: tinystore.Run) -> None:
            started.append(value)
            if value == 1:
                time.sleep(2)  # noqa: ASYNC251 (blocks the loop: the other attempt waits past its lease to start)

        worker = q.work(handler, concurrency=2)
        try:
            await wait_state(q, second, "dead", timeout=10)
            await asyncio.sleep(0.5)
        finally:
            await worker.stop()
        assert started == [1], started
        assert [e.error for e in (await q.get(second)).errors] == ["worker lost"]  # type: ignore[union-attr]
        assert (await q.get(first)).state == "dead"  # type: ignore[union-attr]  (its lease ran out as it blocked)


# contract: JOB-08
async def test_a_handler_woken_past_its_lease_sends_nothing_more(tmp_path: Path) -> None:
    """Trial IL: a worker paused (SIGSTOP) past an attempt's lease woke with its handler's timer and its renewal due
    in one loop turn; the handler's write went out first, after another worker had run the job (an email sent
    twice). A loop blocked past the lease stands for the pause here: the handler's write is not sent (LostError),
    and the job runs again, its second attempt's write alone applied."""
    import time

    async with open_store("private", tmp_path / "store") as store:
        db = await store.database("app", migrations=[("001.sql", "create table sent (attempt integer)")])
        # (held 3.4 s: past the 3 s after which this worker gives a 4 s lease up, short of the store's 4 s, which
        # would tell the worker first, its word read before the loop's timers)
        q = store.queue("mail", lease="4s", attempts=3, backoff=("100ms", "100ms"))
        jid = await q.add(1)
        raised: list[BaseException] = []

        async def handler(value: int, run: tinystore.Run) -> None:
            if run.attempt == 1:
                asyncio.get_running_loop().call_later(0.1, time.sleep, 3.4)  # (the whole loop held: a pause)
                await asyncio.sleep(0.3)  # (its timer due before the worker's renewal as the loop runs again)
            try:
                await db.exec("insert into sent values (?)", run.attempt)
            except tinystore.LostError as exc:
                raised.append(exc)
                raise

        worker = q.work(handler)
        try:
            job = await wait_state(q, jid, "succeeded", timeout=20)
        finally:
            await worker.stop()
        assert await db.all("select attempt from sent") == [{"attempt": 2}]
        assert len(raised) == 1 and "past its lease" in str(raised[0]) and "sql.exec was not sent" in str(raised[0])
        assert job.attempts == 2 and [e.error for e in job.errors] == ["worker lost"]


# contract: JOB-08
@pytest.mark.parametrize("first", ["other code", "the handler"])
async def test_a_lost_handlers_publish_is_refused_and_no_other_callers_in_its_batch(tmp_path: Path, first: str) -> None:
    """Trial IM: the publishes of one loop turn go in one call, made by a task of the SDK's: it carried the guard of
    whichever caller began the batch, so a lost handler's publish went out in a batch begun by other code, and
    other code's publish was refused in a batch the lost handler began. Each publish is checked as it is made."""
    import time

    async with open_store("private", tmp_path / "store") as store:
        ch = store.channel("events", dict)
        heard: list[str] = []
        sub = await ch.subscribe(lambda m: heard.append(m.value["from"]))
        q = store.queue("mail", lease="4s", attempts=3, backoff=("100ms", "100ms"))
        woke = asyncio.Event()
        raised: list[BaseException] = []

        async def noise() -> None:  # (a publish always in flight: the others of a turn are batched)
            while True:
                await ch.publish({"from": "noise"})

        async def handler(value: int, run: tinystore.Run) -> None:
            if run.attempt == 1:
                time.sleep(3.4)  # noqa: ASYNC251 (the loop held past the worker's cutoff, short of the store's)
                woke.set()
                if first == "other code":
                    await asyncio.sleep(0)
                try:
                    await ch.publish({"from": "lost handler"})
                except tinystore.LostError as exc:
                    raised.append(exc)
                    raise

        noisy = [asyncio.ensure_future(noise()) for _ in range(3)]
        worker = q.work(handler)
        try:
            jid = await q.add(1)
            await woke.wait()
            assert await ch.publish({"from": "other code"})  # (an id: published)
            job = await wait_state(q, jid, "succeeded", timeout=20)
        finally:
            for t in noisy:
                t.cancel()
            await asyncio.gather(*noisy, return_exceptions=True)
            await worker.stop()
            await sub.stop()
        assert len(raised) == 1 and "channels.publish was not sent" in str(raised[0])
        assert "lost handler" not in heard and "other code" in heard
        assert job.attempts == 2


# contract: JOB-08
async def test_other_codes_first_call_on_a_queue_is_not_refused_with_a_lost_handlers(tmp_path: Path) -> None:
    """Trial IN: a queue's first call opens it in a task every caller waits for; begun by a handler past its
    lease, it carried the handler's guard, and other code's add waiting for it was refused with the handler's
    LostError. The SDK's own tasks carry no guard."""
    import contextvars
    import time

    async with open_store("private", tmp_path / "store") as store:
        q = store.queue("mail", lease="4s", attempts=3, backoff=("100ms", "100ms"))
        other = store.queue("other")  # (not used yet in this process)
        others: list[asyncio.Task[str]] = []

        async def handler(value: int, run: tinystore.Run) -> None:
            if run.attempt == 1:
                time.sleep(3.4)  # noqa: ASYNC251 (the loop held past the worker's cutoff)
                # (refused or not, as the worker's renewal came through before it or did not)
                mine = asyncio.ensure_future(other.add("from the lost handler"))
                mine.add_done_callback(lambda t: t.cancelled() or t.exception())
                # other code, in this very turn (a context of its own, as a web request's task has)
                loop = asyncio.get_running_loop()
                others.append(loop.create_task(other.add("from other code"), context=contextvars.Context()))
                await mine

        worker = q.work(handler)
        try:
            jid = await q.add(1)
            await wait_state(q, jid, "succeeded", timeout=20)
        finally:
            await worker.stop()
        assert await others[0]  # (an id: added)
        assert "from other code" in [j.value for j in (await other.list()).jobs]


# contract: JOB-08
async def test_tasks_a_handler_started_go_on_after_its_job_is_cancelled(tmp_path: Path) -> None:
    """Trial IN: a cancelled job's handler ends without a report; the lease check then went on for the tasks it had
    started, and refused their calls a lease after the cancel, logging that the process may have been paused. As
    after any other end of a handler, they go on."""
    async with open_store("private", tmp_path / "store") as store:
        db = await store.database("app")
        q = store.queue("mail", lease="2s")
        started = asyncio.Event()
        out: list[str] = []

        async def background() -> None:
            for _ in range(5):
                await asyncio.sleep(0.7)
                try:
                    await db.scalar("select 1")
                    out.append("ok")
                except tinystore.TinystoreError as exc:
                    out.append(repr(exc))

        tasks: list[asyncio.Task[None]] = []

        async def handler(value: int, run: tinystore.Run) -> None:
            tasks.append(asyncio.ensure_future(background()))
            started.set()
            await asyncio.sleep(30)

        worker = q.work(handler)
        try:
            jid = await q.add(1)
            await started.wait()
            await q.cancel(jid)
            await tasks[0]
        finally:
            await worker.stop()
        assert out == ["ok"] * 5, out


# contract: JOB-08
async def test_a_lost_handlers_lock_is_released_for_the_next_attempt(tmp_path: Path) -> None:
    """Trial IM: the guard refused the release of a lock a lost handler held as its block ended: the key stayed
    held for its ttl (30 s), and the job's next attempt waited for it in vain. A release is always sent."""
    import time

    async with open_store("private", tmp_path / "store") as store:
        db = await store.database("app", migrations=[("001.sql", "create table sent (attempt integer)")])
        lock = store.lock("res", ttl="30s")
        q = store.queue("mail", lease="4s", attempts=3, backoff=("100ms", "100ms"))

        async def handler(value: int, run: tinystore.Run) -> None:
            async with lock.hold("k", wait="20s"):
                if run.attempt == 1:
                    time.sleep(3.4)  # noqa: ASYNC251 (the loop held past the worker's cutoff)
                await db.exec("insert into sent values (?)", run.attempt)

        worker = q.work(handler)
        try:
            began = asyncio.get_running_loop().time()
            jid = await q.add(1)
            job = await wait_state(q, jid, "succeeded", timeout=25)
            took = asyncio.get_running_loop().time() - began
        finally:
            await worker.stop()
        assert await db.all("select attempt from sent") == [{"attempt": 2}]
        assert job.attempts == 2 and took < 15, (job.attempts, took)


# contract: JOB-08
async def test_a_handler_that_keeps_renewing_is_never_taken(served: tuple[Path, tinystore.Store]) -> None:
    d, store = served
    q = store.queue("long", attempts=3, lease="1s", timeout="1m")
    runs: list[int] = []

    async def handler(value: Any, run: tinystore.Run) -> int:
        runs.append(run.attempt)
        await asyncio.sleep(4.0)  # four leases long, renewed every third of one
        return os.getpid()

    jid = await q.add({})
    other = await tinystore.open(d)
    workers = [q.work(handler), other.queue("long").work(handler)]
    try:
        job = await wait_state(q, jid, "succeeded", timeout=15)
    finally:
        for w in workers:
            await w.stop()
        await other.close()
    assert runs == [1] and job.attempts == 1 and job.errors == []
