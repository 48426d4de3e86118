"""From trial DO: a write made with a transaction and never awaited (``tx.with_(queue).add(...)`` without
``await``) never ran, and the transaction committed the rows without their job, with only Python's
RuntimeWarning. The transaction now fails: rolled back, nothing of it committed, an error naming the call."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import ClosedError, InvalidError
from tinystore.client.sql import SqlTx

from ..helpers import open_store


async def _setup(store: tinystore.Store) -> tuple[Any, Any, Any, list[Any]]:
    db = await store.database("app", migrations=[("001", "create table docs (name text)")])
    queue = store.queue("ingest", database=db)
    heard: list[Any] = []
    sub = await store.channel("events").subscribe(lambda m: heard.append(m.value))
    return db, queue, sub, heard


async def _first(heard: list[Any]) -> Any:
    for _ in range(200):
        if heard:
            break
        await asyncio.sleep(0.01)
    assert len(heard) == 1, heard
    return heard[0]


@pytest.mark.parametrize("forgot", ["exec", "add", "add_many", "publish", "sync fn"])
async def test_a_write_never_awaited_fails_the_transaction(store: tinystore.Store, forgot: str) -> None:
    db, queue, sub, heard = await _setup(store)
    events = store.channel("events")
    try:

        async def fn(tx: SqlTx) -> Any:
            await tx.exec("insert into docs values ('kept?')")
            if forgot == "exec":
                tx.exec("insert into docs values ('b')")
            elif forgot == "add":
                tx.with_(queue).add({"x": 1})
            elif forgot == "add_many":
                tx.with_(queue).add_many([1, 2])
            elif forgot == "publish":
                tx.with_(events).publish({"k": 1})
            return None

        def sync_fn(tx: SqlTx) -> None:
            tx.with_(queue).add({"x": 1})

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (closed, not left to Python's "never awaited" warning)
            with pytest.raises(InvalidError, match=r"database app: tx: 1 call made with the transaction never") as e:
                await db.tx(sync_fn if forgot == "sync fn" else fn)
        assert "rolled back" in e.value.message
        assert await db.all("select * from docs") == []
        assert (await queue.list()).jobs == []
        await events.publish({"k": 2})
        assert await _first(heard) == {"k": 2}  # (none of the rolled-back transaction's)
    finally:
        await sub.stop()


async def test_a_write_an_async_fn_returns_is_awaited_and_committed(store: tinystore.Store) -> None:
    """spec/API.md: whatever a callback returns that is awaitable is awaited (trial DZ: an async fn's
    `return tx.with_(queue).add(...)` was refused as never awaited, while a lambda's was awaited)."""
    db, queue, sub, _ = await _setup(store)
    try:

        async def fn(tx: SqlTx) -> Any:
            await tx.exec("insert into docs values ('kept')")
            return tx.with_(queue).add({"x": 1})

        job_id = await db.tx(fn)
        assert isinstance(job_id, str) and await queue.get(job_id) is not None
        assert await db.all("select * from docs") == [{"name": "kept"}]
        assert await db.tx(lambda tx: tx.exec("insert into docs values ('also')")) is not None
    finally:
        await sub.stop()


async def test_awaited_writes_commit_as_before(store: tinystore.Store) -> None:
    db, queue, sub, heard = await _setup(store)
    events = store.channel("events")
    try:

        async def fn(tx: SqlTx) -> str:
            await asyncio.gather(*(tx.exec("insert into docs values (?)", str(i)) for i in range(100)))
            await tx.with_(events).publish({"k": 1})
            await tx.with_(queue).add_many([1, 2])
            job_id: str = await tx.with_(queue).add({"x": 1})
            return job_id

        job_id = await db.tx(fn)
        assert await db.scalar("select count(*) from docs") == 100
        assert len((await queue.list()).jobs) == 3 and await queue.get(job_id) is not None
        assert await _first(heard) == {"k": 1}
    finally:
        await sub.stop()


async def test_writes_made_before_a_gather_are_looked_at_in_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From trial DP: the kept writes were looked at every 64 calls while more than 64 waited unstarted, so
    5,000 writes made before a gather took 3.3 s (15,000 ran past tx_max). Looked at once the list doubled."""
    import inspect as inspect_module

    looks = 0
    state = inspect_module.getcoroutinestate

    def counted(coro: Any) -> str:
        nonlocal looks
        looks += 1
        return state(coro)

    monkeypatch.setattr(inspect_module, "getcoroutinestate", counted)
    async with open_store("embedded", tmp_path / "s", serve=False) as store:
        db = await store.database("app", migrations=[("001", "create table docs (name text)")])
        n = 5000

        async def fn(tx: SqlTx) -> None:
            await asyncio.gather(*[tx.exec("insert into docs values (?)", str(i)) for i in range(n)])

        await db.tx(fn)
        assert await db.scalar("select count(*) from docs") == n
    assert looks < 4 * n


async def test_a_task_made_of_a_write_never_awaited_is_cancelled(tmp_path: Path) -> None:
    """From trial DP: a create_task(tx.exec(...)) not awaited in fn had its coroutine closed under the task, which
    then failed with "cannot reuse already awaited coroutine", logged as an exception never retrieved. The
    transaction fails as for any write never awaited, and the task is cancelled before it starts."""
    tasks: list[asyncio.Task[Any]] = []
    async with open_store("embedded", tmp_path / "s", serve=False) as store:
        db = await store.database("app", migrations=[("001", "create table docs (name text)")])

        async def fn(tx: SqlTx) -> None:
            tasks.append(asyncio.create_task(tx.exec("insert into docs values ('x')")))

        with pytest.raises(InvalidError, match=r"never awaited \(tx.exec\)"):
            await db.tx(fn)
        await asyncio.wait(tasks, timeout=5)
        assert tasks[0].cancelled()
        assert await db.all("select * from docs") == []


@pytest.mark.parametrize("forgot", ["add task", "exec task", "gather", "helper task"])
async def test_a_write_still_under_way_as_fn_returns_fails_the_transaction(
    any_store: tinystore.Store, forgot: str, caplog: pytest.LogCaptureFixture
) -> None:
    """From trial DS: a ``create_task(tx.with_(queue).add(...))`` never awaited, on a queue not used yet, had
    started (it waited on the queue's first use) as fn returned: it was passed over, the transaction committed its
    row, and the add then failed on the ended transaction, only logged. A write started but not finished as fn
    returns fails the transaction as one never awaited does. A task made of it is cancelled, a gather as a whole
    (trial DU: its children cancelled, it logged a CancelledError never retrieved); a task of the application's
    that awaits it deeper down is left to run (trial DU: a long-lived one was cancelled)."""
    store = any_store
    db = await store.database("app", migrations=[("001", "create table docs (name text)")])
    queue = store.queue("ingest", database=db)  # (not used before: its add waits on its first use)
    events = store.channel("events")
    heard: list[Any] = []
    sub = await events.subscribe(lambda m: heard.append(m.value))
    started: list[asyncio.Future[Any]] = []
    try:

        async def helper(tx: SqlTx) -> None:
            await tx.exec("insert into docs values ('helper')")

        async def fn(tx: SqlTx) -> None:
            await tx.exec("insert into docs values ('kept?')")
            if forgot == "add task":
                started.append(asyncio.create_task(tx.with_(queue).add({"x": 1})))
            elif forgot == "exec task":
                started.append(asyncio.create_task(tx.exec("insert into docs values ('b')")))
            elif forgot == "gather":
                started.append(asyncio.gather(*(tx.exec("insert into docs values (?)", str(i)) for i in range(3))))
            else:
                started.append(asyncio.create_task(helper(tx)))
            await asyncio.sleep(0)  # (each has started: its first step ran)

        with pytest.raises(InvalidError, match=r"database app: tx: \d+ calls? made with the transaction still under"):
            await db.tx(fn)
        await asyncio.wait(started, timeout=10)
        if forgot == "helper task":
            # the application's own task, left to run: its exec, sent before the rollback, was rolled back with it
            assert started[0].done() and not started[0].cancelled()
            started[0].exception()
        elif forgot == "gather":
            # (cancelled, a gather holds a CancelledError: not looked at here, so that the check below sees whether
            # anything else took it)
            assert started[0].done() and "CancelledError" in repr(started[0]), started
        else:
            assert started[0].cancelled(), started
        assert await db.all("select * from docs") == []
        assert (await queue.list()).jobs == []
        await events.publish({"k": 2})
        assert await _first(heard) == {"k": 2}  # (none of the rolled-back transaction's)
        # nothing cancelled is logged as an exception never retrieved
        started.clear()
        import gc

        gc.collect()
        assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text
    finally:
        await sub.stop()


async def test_a_task_fn_did_not_await_is_told_why_its_later_write_is_not_run(tmp_path: Path) -> None:
    """From trial DU: a task fn started makes its write after fn returned (the transaction committed): nothing can
    see that write coming. It fails saying why. And a task of the application's, made outside fn, that runs the
    writes fn hands it, is not cancelled when fn returns with one under way."""
    async with open_store("embedded", tmp_path / "s", serve=False) as store:
        db = await store.database("app", migrations=[("001", "create table docs (name text)")])
        calls: asyncio.Queue[Any] = asyncio.Queue()

        async def runner() -> None:  # runs the writes fn hands it
            while True:
                coro = await calls.get()
                with contextlib.suppress(Exception):
                    await coro

        shared = asyncio.create_task(runner())
        late: list[asyncio.Task[Any]] = []

        async def later(tx: SqlTx) -> None:
            await asyncio.sleep(0.05)
            await tx.exec("insert into docs values ('late')")

        async def fn(tx: SqlTx) -> None:
            await tx.exec("insert into docs values ('a')")
            late.append(asyncio.create_task(later(tx)))

        await db.tx(fn)  # (nothing of the task's was made yet: committed)
        with pytest.raises(ClosedError, match=r"has ended: a call made with it after its fn returned"):
            await late[0]

        async def handed(tx: SqlTx) -> None:
            await tx.exec("insert into docs values ('b')")
            await calls.put(tx.exec("insert into docs values ('c')"))
            await asyncio.sleep(0)

        with pytest.raises(InvalidError, match="still under way"):
            await db.tx(handed)
        await asyncio.sleep(0.05)
        assert not shared.done()  # (the application's task goes on)
        assert await db.all("select name from docs order by name") == [{"name": "a"}]
        shared.cancel()
        await asyncio.gather(shared, return_exceptions=True)


async def test_a_nested_gather_under_way_as_fn_returns_logs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """From trial DV: a gather of a gather of writes, never awaited: the inner one was cancelled and its error
    taken, and the outer one's was logged as never retrieved. The outermost gather is cancelled."""
    async with open_store("embedded", tmp_path / "s", serve=False) as store:
        db = await store.database("app", migrations=[("001", "create table docs (name text)")])
        outer: list[asyncio.Future[Any]] = []

        async def fn(tx: SqlTx) -> None:
            await tx.exec("insert into docs values ('a')")
            inner = asyncio.gather(tx.exec("insert into docs values ('b')"), tx.exec("insert into docs values ('c')"))
            outer.append(asyncio.gather(inner, asyncio.sleep(0.01)))
            await asyncio.sleep(0)

        with pytest.raises(InvalidError, match="still under way"):
            await db.tx(fn)
        await asyncio.wait(outer, timeout=5)
        assert outer[0].done()
        outer.clear()
        import gc

        gc.collect()
        await asyncio.sleep(0.05)
        assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text
        assert await db.all("select * from docs") == []


async def test_a_call_after_the_connection_dropped_is_told_so(tmp_path: Path) -> None:
    """From trial DV: inside fn, once the connection had dropped, the second call (and the commit) said "a call
    made with it after its fn returned (from a task ...)": fn had not returned."""
    from tinystore import UnavailableError

    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001", "create table docs (name text)")])
        told: list[str] = []

        async def fn(tx: SqlTx) -> None:
            await tx.exec("insert into docs values ('a')")
            store.transport.reconnects += 1  # (as after the connection dropped and the SDK reconnected)
            for _ in range(2):
                try:
                    await tx.exec("insert into docs values ('b')")
                except UnavailableError as exc:
                    told.append(exc.message)

        with pytest.raises(UnavailableError, match="the connection to the store dropped since transaction"):
            await db.tx(fn)
        assert len(told) == 2 and all("the connection to the store dropped" in m for m in told), told


@pytest.mark.parametrize("shape", ["shield in gather", "gather in shield", "gather with a task of its own"])
async def test_what_is_made_of_a_write_under_way_logs_nothing_and_other_tasks_go_on(
    tmp_path: Path, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    """From trial DW: a shield between the write and its gather left the gather's CancelledError to be logged as
    never retrieved; and cancelling a gather from the top cancelled a task of the application's it gathered."""
    async with open_store("embedded", tmp_path / "s", serve=False) as store:
        db = await store.database("app", migrations=[("001", "create table docs (name text)")])
        made: list[asyncio.Future[Any]] = []
        own = asyncio.create_task(asyncio.sleep(0.3, "done"))  # the application's, made before the transaction

        async def fn(tx: SqlTx) -> None:
            await tx.exec("insert into docs values ('a')")
            write = tx.exec("insert into docs values ('b')")
            if shape == "shield in gather":
                made.append(asyncio.gather(asyncio.shield(write)))
            elif shape == "gather in shield":
                made.append(asyncio.shield(asyncio.gather(write)))
            else:
                made.append(asyncio.gather(asyncio.gather(write), own))
            await asyncio.sleep(0)

        with pytest.raises(InvalidError, match="still under way"):
            await db.tx(fn)
        await asyncio.wait(made, timeout=5)
        assert await own == "done"  # (not cancelled)
        made.clear()
        import gc

        gc.collect()
        await asyncio.sleep(0.05)
        assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text
        assert await db.all("select * from docs") == []
