"""``queue.retry`` and ``queue.cancel`` cancelled at any point: what the store committed is followed through (trial
GQ: a retry cancelled after its commit left a job queued that no worker saw, that could be neither cancelled nor
retried until a restart; a cancel cancelled after its commit ended the job but never told its running handler)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

import tinystore

from .util import wait_state


async def _cancel_after(call: Any, turns: int) -> bool:
    """Run ``call`` (a coroutine), cancelled after ``turns`` turns of the loop; whether the cancel cut it short."""
    task = asyncio.ensure_future(call)
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return task.cancelled()


# contract: JOB-01
# contract: JOB-09
async def test_a_cancelled_retry_leaves_a_job_that_runs_or_stays_cancelled(store: tinystore.Store) -> None:
    q = store.queue("retried")
    ran: list[int] = []

    async def handler(value: dict[str, int], run: tinystore.Run) -> None:
        ran.append(value["n"])

    worker = q.work(handler, concurrency=4)
    try:
        ids = []
        for k in range(24):
            jid = await q.add({"n": k}, delay="1h")
            assert await q.cancel(jid)
            await _cancel_after(q.retry(jid), k % 12)
            ids.append(jid)
        for jid in ids:
            job = await wait_state(q, jid, "succeeded", "cancelled")
            if job.state == "cancelled":  # (the retry never began) it can be retried still, and then runs
                assert await q.retry(jid)
            await wait_state(q, jid, "succeeded")
        assert sorted(ran) == list(range(24))
    finally:
        await worker.stop()


# contract: JOB-09
async def test_a_cancelled_cancel_of_a_running_job_still_stops_its_handler(store: tinystore.Store) -> None:
    q = store.queue("stopped")
    started: dict[int, asyncio.Event] = {}
    stopped: dict[int, asyncio.Event] = {}

    async def handler(value: dict[str, int], run: tinystore.Run) -> None:
        n = value["n"]
        started[n].set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped[n].set()
            raise

    worker = q.work(handler, concurrency=2)
    try:
        for k in range(16):
            started[k], stopped[k] = asyncio.Event(), asyncio.Event()
            jid = await q.add({"n": k})
            await asyncio.wait_for(started[k].wait(), 10)
            await _cancel_after(q.cancel(jid), k % 8)
            await q.cancel(jid)  # (True when the cancelled call never began, else False: it is cancelled already)
            await wait_state(q, jid, "cancelled")
            await asyncio.wait_for(stopped[k].wait(), 10)  # its handler was told, whichever call did it
    finally:
        await worker.stop()


async def _noop(value: Any, run: tinystore.Run) -> None:
    pass


async def _queued(q: tinystore.Queue[Any]) -> int:
    n, after = 0, None
    while True:
        page = await q.list(state="queued", limit=1000, after=after)
        n += len(page.jobs)
        if page.next is None:
            return n
        after = page.next


# contract: JOB-01
async def test_a_cancelled_add_many_in_its_own_transaction_leaves_jobs_that_run(store: tinystore.Store) -> None:
    # trial GS: over 400 jobs, add_many writes in a transaction of its own; cancelled at its commit, the jobs were
    # queued where no worker saw them; cancelled as it began, its transaction held the database's writer 5 s
    q = store.queue("big")
    for k in range(0, 30, 3):
        await _cancel_after(q.add_many([{"k": k, "i": i} for i in range(401)]), k)
        await asyncio.wait_for(q.add({"k": k, "one": True}), 3)  # (no transaction holds the writer)
    await asyncio.sleep(0.3)  # (a cancelled add_many's commit lands)
    ran = await q.run_due(_noop, concurrency=50)
    assert (ran - 10) % 401 == 0 and await _queued(q) == 0


# contract: JOB-06
async def test_an_add_in_a_transaction_cancelled_then_committed_runs(store: tinystore.Store) -> None:
    # trial GS: the add's rows were written in the transaction, then its caller was cancelled before the commit's
    # hook was set: committed, never run
    db = await store.database("app")
    q = store.queue("in-tx", database=db)
    await q.add({"k": -1})  # (the queue open)
    # cancels later and later, until one comes after the add's end: the window where its rows are written and its
    # answer not yet seen lies between, whatever the machine's speed (a CI run under load cancelled every add of a
    # fixed 0 to 60 turns before it was sent)
    k = 0
    while True:
        completed: list[bool] = []

        async def fn(tx: tinystore.SqlTx, k: int = k, completed: list[bool] = completed) -> None:
            completed.append(not await _cancel_after(tx.with_(q).add({"k": k}), k))

        await db.tx(fn)
        if completed[0] or k > 20_000:
            break
        k += 4 if k < 64 else k // 4
    ran = await q.run_due(_noop, concurrency=8)
    assert ran >= 2 and await _queued(q) == 0


# contract: JOB-10
async def test_a_cancelled_progress_still_wakes_its_watchers(store: tinystore.Store) -> None:
    # trial GS: committed, the progress woke no watcher (it saw it when its 30 s wait ended) and was not published
    from .util import claim, progress

    q = store.queue("watched")
    cut = 0
    for k in range(24):
        jid = await q.add({"k": k})
        (c,) = await claim(store, "watched")
        watch = q.watch(jid)
        first = await anext(watch)
        assert first.progress is None
        cancelled = await _cancel_after(progress(store, "watched", c, f'{{"n": {k}}}'), k)
        await asyncio.sleep(0.05)  # (a write handed over lands)
        job = await q.get(jid)
        assert job is not None
        if job.progress is not None:  # written: its watcher is woken at once, not at the end of its wait
            cut += cancelled
            seen = await asyncio.wait_for(anext(watch), 5)
            assert seen.progress == {"n": k}
        await watch.aclose()
    if store.transport.local:  # (embedded, where loop turns are the engine's steps)
        assert cut  # (some call was cut short after its write)


async def test_job_calls_ended_by_the_stores_close_raise_closed_error_not_a_cancel(tmp_path: Path) -> None:
    # trial GR: the close cancelled the engine's task of a configure or a cancel, and its caller, never cancelled,
    # got a bare CancelledError; (a caller cancelled meanwhile logs nothing of the call's own error: no ERROR line)
    store = await tinystore.open(tmp_path / "s", embedded=True)
    q = store.queue("closing")
    jid = await q.add({})
    gate = asyncio.Event()
    engine: Any = store.transport.core.engines["jobs"]  # type: ignore[attr-defined]
    real = engine._cancel

    async def slow_cancel(*args: Any) -> bool:
        await gate.wait()  # (never set: the close ends it)
        return bool(await real(*args))

    engine._cancel = slow_cancel
    call = asyncio.ensure_future(q.cancel(jid))
    await asyncio.sleep(0.1)
    await store.close()
    with pytest.raises(tinystore.ClosedError):
        await call


# contract: JOB-06
async def test_a_cancelled_open_that_makes_a_missing_database_anew_leaves_its_queue_usable(tmp_path: Path) -> None:
    # trial GS: a queue's database file went missing; store.database(name), cancelled after it made the file anew,
    # skipped the warning and the forgetting of the queue's tables: every later add raised UnavailableError
    for k in (0, 2, 5, 10, 20, 40):
        d = tmp_path / f"s{k}"
        async with await tinystore.open(d, embedded=True) as store:
            db = await store.database("app")
            await store.queue("qa", database=db).add(1)
        for suffix in ("", "-wal", "-shm"):
            (d / "sql" / f"app.db{suffix}").unlink(missing_ok=True)
        async with await tinystore.open(d, embedded=True) as store:
            await _cancel_after(store.database("app"), k)
            await asyncio.sleep(0.2)
            await store.database("app")
            await store.queue("qa", database="app").add(2)  # (the queue begins anew in the new file)
