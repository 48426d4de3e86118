"""A ``db.tx`` cancelled at any moment leaves no transaction open at the server (which would hold the writer
until ``tx_idle``): cancelled while its ``BEGIN`` is answered, or while its ``COMMIT`` is on its way.

A client over an embedded store's socket: one event loop runs both sides, so the moment of the cancel is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store

MIGRATIONS = [("001", "create table t (id integer primary key, v text)")]


@contextlib.asynccontextmanager
async def server_and_client(tmp_path: Path) -> AsyncIterator[tuple[Any, tinystore.Database, tinystore.Database]]:
    """The SQL engine of an embedded store, a database through it, and the same database through a client
    over its socket."""
    async with open_store("embedded", tmp_path / "s") as store:
        local = await store.database("app", migrations=MIGRATIONS)
        other = await tinystore.open(tmp_path / "s")
        try:
            yield store._core.sql, local, await other.database("app")
        finally:
            await other.close()


async def until(cond: Any, what: str, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def settle(task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_tx_cancelled_while_the_server_opens_it_is_rolled_back(tmp_path: Path) -> None:
    # cancelled some loop turns after the server took the begin: before the writer began it, while its answer
    # is on the way (the cancel is sent, the answer comes after all: the client rolls back what it names), or
    # inside fn; which of these a number of turns gives depends on the writer thread, so each is tried twice
    async with server_and_client(tmp_path) as (engine, local, remote):

        async def fn(tx: Any) -> None:
            await asyncio.Event().wait()

        for turns in [*range(16), *range(16)]:
            task = asyncio.ensure_future(remote.tx(fn))
            while not engine.transactions:
                await asyncio.sleep(0)
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            await settle(task)
            await until(
                lambda: not engine.transactions, f"the transaction cancelled after {turns} turns to be rolled back"
            )
        await asyncio.wait_for(local.exec("insert into t (v) values ('after')"), 2)


async def test_a_tx_cancelled_in_the_loop_turn_its_begin_is_answered_is_rolled_back(tmp_path: Path) -> None:
    async with server_and_client(tmp_path) as (engine, local, remote):
        conn: Any = remote._transport._conn  # type: ignore[attr-defined]
        original = conn.data_received
        task: asyncio.Task[Any] | None = None

        def data_received(data: bytes) -> None:  # the answer resolves the call's future, then the cancel comes
            original(data)
            if task is not None and not task.done():
                task.cancel()

        conn.data_received = data_received
        task = asyncio.ensure_future(remote.tx(lambda tx: None))
        await settle(task)
        conn.data_received = original
        await until(lambda: not engine.transactions, "the transaction to be rolled back (not left to tx_idle)")
        await asyncio.wait_for(local.exec("insert into t (v) values ('after')"), 2)


@pytest.mark.parametrize("turns", range(10))
async def test_a_tx_cancelled_around_its_commit_ends_at_once(tmp_path: Path, turns: int) -> None:
    # cancelled a few loop turns into the transaction: before, during or after the commit is sent; the
    # transaction either committed or was rolled back, and nothing holds the writer
    async with server_and_client(tmp_path) as (engine, local, remote):
        go = asyncio.Event()

        async def fn(tx: Any) -> None:
            await go.wait()
            await tx.exec("insert into t (v) values ('in tx')")

        task = asyncio.ensure_future(remote.tx(fn))
        await until(lambda: len(engine.transactions) == 1, "the server to open the transaction")
        go.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        await settle(task)
        await until(lambda: not engine.transactions, "the transaction to end (not left to tx_idle)")
        await asyncio.wait_for(local.exec("insert into t (v) values ('after')"), 2)
        assert await local.scalar("select count(*) from t where v = 'in tx'") in (0, 1)


async def test_a_commit_cancelled_before_the_server_ran_it_ends_the_transaction(tmp_path: Path) -> None:
    # the commit request and its CANCEL reach the server in one read: the commit is never run; the client
    # then rolls back, rather than leave the transaction open (holding the writer) until tx_idle
    async with server_and_client(tmp_path) as (engine, local, remote):
        conn: Any = remote._transport._conn  # type: ignore[attr-defined]
        original = conn.flush

        def flush() -> None:  # a commit request waits for the next frame, to go out with it in one write
            if any(b"sql.commit" in f for f in conn.out) and not any(b"sql.commit" not in f for f in conn.out):
                conn.flush_scheduled = False
                return
            original()

        conn.flush = flush
        task = asyncio.ensure_future(remote.tx(lambda tx: tx.exec("insert into t (v) values ('in tx')")))
        await until(lambda: any(b"sql.commit" in f for f in conn.out), "the commit to be queued")
        task.cancel()
        await settle(task)
        conn.flush = original
        await until(lambda: not engine.transactions, "the transaction to end (not left to tx_idle)")
        await asyncio.wait_for(local.exec("insert into t (v) values ('after')"), 2)
        assert await local.scalar("select count(*) from t where v = 'in tx'") == 0


@pytest.mark.parametrize("remote_side", [False, True], ids=["embedded", "socket"])
async def test_a_tx_cancelled_while_it_commits_keeps_its_jobs_and_messages(tmp_path: Path, remote_side: bool) -> None:
    # contract: JOB-06
    # contract: CHAN-03
    # a cancel that comes while the commit runs: the commit goes on, and so do the jobs the transaction added and
    # the messages it published (they were dropped: the rows committed, the jobs never ran, the messages never came)
    async with server_and_client(tmp_path) as (engine, local, remote):
        db = remote if remote_side else local
        q = db.store.queue("q", database=db)
        ch = db.store.channel("ev")
        heard: list[int] = []
        sub = await local.store.channel("ev").subscribe(lambda m: heard.append(m.value))
        ran: list[int] = []
        worker = local.store.queue("q", database=local).work(lambda v, run: ran.append(v["k"]))
        try:
            for k in range(24):
                go = asyncio.Event()

                async def fn(tx: Any, k: int = k, go: asyncio.Event = go) -> None:
                    await go.wait()
                    await tx.exec("insert into t (v) values (?)", f"k{k}")
                    await tx.with_(q).add({"k": k})
                    await tx.with_(ch).publish(k)

                task = asyncio.ensure_future(db.tx(fn))
                await until(lambda: len(engine.transactions) == 1, "the transaction to begin")
                go.set()
                for _ in range(k % 12):
                    await asyncio.sleep(0)
                task.cancel()
                await settle(task)
                await until(lambda: not engine.transactions, "the transaction to end")
            rows = await local.all("select v from t where v like 'k%'")
            committed = sorted(int(r["v"][1:]) for r in rows)
            await until(lambda: sorted(ran) == committed, f"the jobs of the committed transactions {committed}", 5)
            await until(lambda: sorted(heard) == committed, "the messages of the committed transactions", 5)
        finally:
            await worker.stop()
            await sub.stop()


# contract: SQL-03
@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_fn_that_handles_a_task_groups_error_commits(tmp_path: Path, mode: str) -> None:
    # trial GE: on Python 3.11, a TaskGroup whose child fails while fn waits at the group's end leaves the task's
    # cancelling() at 1 with no cancel pending; a tx that took that for a cancel fn swallowed rolled back, and
    # raised CancelledError in a task nobody cancelled (so a swallowed cancel is not told from it: fn's to re-raise)
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app", migrations=MIGRATIONS)

        async def fn(tx: tinystore.SqlTx) -> str:
            await tx.exec("insert into t (v) values ('kept')")

            async def bad() -> None:
                await asyncio.sleep(0.01)
                raise ValueError("one fetch failed")

            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(bad())
                    tg.create_task(asyncio.sleep(5))
            except* ValueError:
                pass
            return "done"

        assert await db.tx(fn) == "done"
        assert await db.scalar("select count(*) from t") == 1
