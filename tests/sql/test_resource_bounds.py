"""Bounds on what one client can make the server hold (trial S): read-only transactions per database (each a
thread and a connection), databases per store (each a writer, readers and files), and no new database from a
``data`` token. Past a bound: ``LimitError`` naming it, and everything already open goes on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tinystore
from tinystore import LimitError, PermissionDeniedError

from ..helpers import ServerProcess, open_store, write_tokens


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_read_only_transactions_of_the_store_are_bounded(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(read_transactions=2)) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (a)")])
        inside = asyncio.Semaphore(0)
        leave = asyncio.Event()

        async def hold(tx: tinystore.SqlTx) -> int:
            inside.release()
            await leave.wait()
            return int(await tx.scalar("select count(*) from t"))

        held = [asyncio.ensure_future(db.tx(hold, read_only=True)) for _ in range(2)]
        for _ in held:
            await inside.acquire()
        with pytest.raises(LimitError, match=r"2 read-only transactions are open in the store.*read_transactions, 2"):
            await db.tx(hold, read_only=True)
        other = await store.database("other")  # the bound is the store's, all databases together (trial V)
        with pytest.raises(LimitError, match="read-only transactions are open in the store"):
            await other.tx(lambda tx: tx.scalar("select 1"), read_only=True)
        await db.exec("insert into t values (1)")  # writes and reads go on
        assert await db.scalar("select count(*) from t") == 1
        leave.set()
        assert await asyncio.gather(*held) == [0, 0]
        assert await db.tx(hold, read_only=True) == 1  # room again


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_databases_of_a_store_are_bounded(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(databases=2)) as store:
        a = await store.database("a")
        b = await store.database("b")

        async def in_a(_: tinystore.SqlTx) -> None:
            async def in_b(_: tinystore.SqlTx) -> None:  # each in use (else one not in use makes room: trial EM)
                with pytest.raises(LimitError, match=r"the store has 2 databases open.*Limits.databases, 2"):
                    await store.database("c")

            await b.tx(in_b, read_only=True)

        await a.tx(in_a, read_only=True)
        assert not (tmp_path / "s" / "sql" / "c.db").exists()
        assert (await store.database("a")) is a  # open ones open again
        await a.exec("create table t (x)")


@pytest.fixture
async def admin_and_data(tmp_path: Path) -> AsyncIterator[tuple[tinystore.Store, tinystore.Store]]:
    """Two clients of one TCP server (its store in ``tmp_path / "store"``): one with an admin token, one with a
    data token."""
    tokens, admin, data = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "store", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        boss = await tinystore.connect(server.tcp, token=admin)
        try:
            user = await tinystore.connect(server.tcp, token=data)
            try:
                yield boss, user
            finally:
                await user.close()
        finally:
            await boss.close()
    finally:
        server.stop()


async def test_a_data_token_cannot_make_a_database(
    tmp_path: Path, admin_and_data: tuple[tinystore.Store, tinystore.Store]
) -> None:
    boss, user = admin_and_data
    with pytest.raises(PermissionDeniedError, match="making one needs the admin capability"):
        await user.database("new")
    assert not (tmp_path / "store" / "sql" / "new.db").exists()
    await boss.database("new")
    db = await user.database("new")  # made by the admin: a data token opens it
    assert await db.scalar("select 1") == 1


async def test_a_data_token_cannot_make_the_jobs_tables_of_a_database(
    tmp_path: Path, admin_and_data: tuple[tinystore.Store, tinystore.Store]
) -> None:
    # trial S: opening a queue in an application database made its jobs tables there with a data token (a schema
    # change), and the jobs engine opened (made) the database itself for it
    boss, user = admin_and_data
    await boss.database("app")
    db = await user.database("app")
    with pytest.raises(PermissionDeniedError, match="has no jobs tables yet, and making them needs the admin") as e:
        await user.queue("mail", database=db).add({"to": "a@x"})
    # trial EL: it said "open the queue once with an admin token", and store.queue(...) alone makes nothing
    assert "call the queue once with an admin token (`await queue.list(limit=1)`" in str(e.value)
    assert await db.scalar("select count(*) from sqlite_master where name = '_tinystore_jobs'") == 0
    boss.queue("mail", database="app")  # opened by the admin, never called: still no tables
    with pytest.raises(PermissionDeniedError, match="has no jobs tables yet"):
        await user.queue("mail", database=db).add({"to": "a@x"})
    await boss.queue("mail", database="app").list(limit=1)  # as the message says: now a data token adds
    assert len(await user.queue("mail", database=db).add({"to": "a@x"})) > 0
    with pytest.raises(PermissionDeniedError, match="database nope does not exist"):
        await user.queue("other", database="nope").add({"to": "a@x"})
    assert not (tmp_path / "store" / "sql" / "nope.db").exists()
    await boss.queue("mail", database=await boss.database("app")).add({"to": "boss@x"})
    await user.queue("mail", database=db).add({"to": "b@x"})  # made by the admin: a data token adds
    assert await db.scalar("select count(*) from _tinystore_jobs") == 3
    await user.queue("plain").add({"x": 1})  # the store's own jobs database: any token
