"""From trial EM: a database, once opened, stayed open for the server's life (a writer thread, its readers, its
files), so ``Limits.databases`` counted every database opened since the start and refused the next for good, and
the descriptors of a burst of read-only transactions were never given back (SQLite closes a connection's file only
once no other connection of the process holds a lock on it). A database no call uses for ``Limits.database_idle``
is closed now, and at ``Limits.databases`` the one used the longest ago, unused, makes room."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

import tinystore
from tinystore import LimitError

from ..helpers import open_store

IDLE = tinystore.Limits(database_idle=0.2)


async def open_now(store: tinystore.Store) -> list[str]:
    status = await store.status()
    return sorted(name for name, db in status["databases"].items() if db.get("open"))


async def until_closed(store: tinystore.Store, name: str) -> None:
    async with asyncio.timeout(10):
        while name in await open_now(store):
            await asyncio.sleep(0.05)


def sql_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tinystore-sql-db")]


def db_files_open(path: Path) -> int:
    """This process's descriptors on ``path``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return n


# contract: STORE-04
@pytest.mark.parametrize("mode", ["embedded", "private", "tcp"])
async def test_a_database_no_call_uses_is_closed_and_opened_again_at_its_next_call(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", limits=IDLE) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (x)")])
        await db.exec("insert into t values (1)")
        await until_closed(store, "app")
        # status tells it was closed as unused (trial EO: it read as never opened), with the keys of an open one
        # (trial EP: they changed with the state)
        closed = (await store.status())["databases"]["app"]
        assert closed["closed_as_unused"] is True and closed["open_transactions"] is None and closed["bytes"] > 0
        # its counters are kept, and go on when it opens again (trial EP: they started again from 0)
        assert closed["writes"] == 1 and closed["commits"] >= 1, closed
        # the same handle goes on: its next call opens the database again, with what was committed
        assert await db.scalar("select count(*) from t") == 1
        assert "app" in await open_now(store)
        opened = (await store.status())["databases"]["app"]
        assert opened.keys() == closed.keys() and opened["closed_as_unused"] is False and opened["reads"] >= 1
        await db.exec("insert into t values (2)")
        assert (await store.status())["databases"]["app"]["writes"] == 2
        assert await db.scalar("select sum(x) from t") == 3
        # opening it again with its migrations applies none, and refuses a changed one as before
        again = await store.database("app", migrations=[("001.sql", "create table t (x)")])
        assert await again.scalar("select count(*) from t") == 2


# contract: STORE-04
async def test_threads_and_files_of_unused_databases_are_given_back(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", limits=IDLE) as store:
        dbs = [await store.database(f"db{i}", migrations=[("001.sql", "create table t (x)")]) for i in range(3)]

        path = tmp_path / "s" / "sql" / "db0.db"

        async def burst(db: tinystore.Database) -> int:
            """20 read-only transactions open at once (a connection, a descriptor each); the most files seen."""
            inside = 0
            all_in = asyncio.Event()

            async def read(tx: tinystore.SqlTx) -> int:
                nonlocal inside
                await tx.all("select * from t")
                inside += 1
                if inside == 20:
                    all_in.set()
                await all_in.wait()
                return db_files_open(path)

            return max(await asyncio.gather(*(db.tx(read, read_only=True) for _ in range(20))))

        assert await burst(dbs[0]) >= 20
        for db in dbs[1:]:
            await burst(db)
        for i in range(3):
            await until_closed(store, f"db{i}")
        async with asyncio.timeout(10):
            while sql_threads() or db_files_open(path):
                await asyncio.sleep(0.05)
        assert await dbs[0].scalar("select count(*) from t") == 0  # and it opens again


# contract: STORE-04
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_at_the_database_limit_an_unused_one_makes_room_and_one_in_use_does_not(
    tmp_path: Path, mode: str
) -> None:
    limits = tinystore.Limits(databases=2)  # (database_idle: its default, a minute)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        first = await store.database("first", migrations=[("001.sql", "create table t (x)")])
        await first.exec("insert into t values (1)")
        second = await store.database("second")
        third = await store.database("third")  # "first", used the longest ago, was closed to make room
        assert await open_now(store) == ["second", "third"]
        assert await first.scalar("select x from t") == 1  # opened again: "second" made room
        assert await open_now(store) == ["first", "third"]

        async def hold(tx: tinystore.SqlTx) -> None:
            async def hold_too(tx2: tinystore.SqlTx) -> None:
                with pytest.raises(LimitError, match="none was done with in the 2s this call waited") as raised:
                    await store.database("fourth")
                assert (raised.value.limit, raised.value.wanted) == (2, 3)

            await third.tx(hold_too, read_only=True)

        await first.tx(hold, read_only=True)  # a transaction in each: neither is closed
        assert await second.scalar("select 1") == 1


# contract: STORE-04
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_burst_of_calls_on_many_closed_databases_keeps_to_the_limit(tmp_path: Path, mode: str) -> None:
    # (trial EU: with a limit of 20, one call on each of 120 databases closed as unused, all at once, opened all
    # 120: the opens under way were not counted, and each closed one more to make room)
    limits = tinystore.Limits(databases=4)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        dbs = []
        for i in range(16):
            db = await store.database(f"d{i}", migrations=[("001.sql", "create table t (x)")])
            await db.exec("insert into t values (?)", i)
            dbs.append(db)
        assert len(await open_now(store)) == 4
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, len(await open_now(store)))
                await asyncio.sleep(0.005)

        watcher = asyncio.ensure_future(watch())
        try:
            # each waits for a database to be done with, rather than fail: every call is answered
            assert await asyncio.gather(*(db.scalar("select x from t") for db in dbs)) == list(range(16))
            await asyncio.gather(
                *(db.tx(lambda tx, i=i: tx.exec("insert into t values (?)", -i)) for i, db in enumerate(dbs))
            )
        finally:
            watcher.cancel()
        assert most <= 4 and len(await open_now(store)) == 4, most
        assert [await db.scalar("select count(*) from t") for db in dbs] == [2] * 16


# contract: JOB-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_database_holding_a_queue_s_jobs_stays_open(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", limits=IDLE) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (x)")])
        other = await store.database("other")
        await other.exec("create table if not exists t (x)")
        queue = store.queue("mail", database=db)
        await queue.add({"to": "a@x"})
        await until_closed(store, "other")
        assert "app" in await open_now(store)
        job = (await queue.list()).jobs[0]
        assert job.state == "queued"


# contract: JOB-06
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_the_jobs_database_takes_none_of_the_database_limit(tmp_path: Path, mode: str) -> None:
    # trial EX: with every queue in an application database, tinystore-jobs (never closed) took one of
    # Limits.databases for good: at databases=2, the second application database's queue failed, LimitError
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(databases=2)) as store:
        a = await store.database("a")
        b = await store.database("b")
        for name, db in (("qa", a), ("qb", b)):
            queue = store.queue(name, database=db)
            await asyncio.wait_for(queue.add({"x": 1}), 1.5)  # (a wait for room would be 2 s, then LimitError)
        assert await open_now(store) == ["a", "b", "tinystore-jobs"]
        with pytest.raises(LimitError, match=r"database c: the store has 2 databases open"):
            await store.database("c")  # (both hold a queue's jobs: neither is closed for it)


# contract: STORE-04
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_calls_waiting_for_room_each_wait_at_most_the_room_wait_and_a_stop_ends_them(
    tmp_path: Path, mode: str
) -> None:
    # (trial EV: six calls on one closed database at the limit failed after 2, 4, ... 12 s, queued behind each
    # other's wait; a stop during the wait raised LimitError, not ClosedError)
    limits = tinystore.Limits(databases=1)
    store = await tinystore.open(tmp_path / "s", limits=limits, **{mode: True})  # type: ignore[arg-type]
    try:
        a = await store.database("a", migrations=[("001.sql", "create table t (x)")])
        held = asyncio.Event()
        done = asyncio.Event()

        async def hold(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values (1)")
            held.set()
            await done.wait()

        holder = asyncio.ensure_future(a.tx(hold))
        await held.wait()

        async def call() -> tuple[str, float]:
            began = time.monotonic()
            try:
                await (await store.database("b")).scalar("select 1")
                return "ok", time.monotonic() - began
            except LimitError as exc:
                assert "none was done with in the 2s this call waited" in exc.message, exc.message
                return "LimitError", time.monotonic() - began

        outcomes = await asyncio.gather(*(call() for _ in range(4)))
        assert [o for o, _ in outcomes] == ["LimitError"] * 4
        assert max(took for _, took in outcomes) < 3.5, outcomes
        done.set()
        await holder

        if mode == "embedded":  # (over a socket, the client's own close answers first)
            done.clear()
            held.clear()
            holder = asyncio.ensure_future(a.tx(hold))
            await held.wait()
            waiting = asyncio.ensure_future(store.database("b"))
            await asyncio.sleep(0.2)
            closing = asyncio.ensure_future(store.close())
            with pytest.raises(tinystore.ClosedError):
                await waiting
            done.set()
            await asyncio.gather(holder, return_exceptions=True)
            await closing
    finally:
        await store.close()
