"""SQL contracts (SQL-01..06) over the embedded, private and sidecar ways of reaching the store."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

import tinystore
from tinystore import ConflictError, InvalidError

from ..helpers import open_store

SCHEMA = [
    (
        "001_init.sql",
        "create table t (id integer primary key, v);\n"
        "create table acct (id integer primary key, balance integer not null);\n"
        "insert into acct values (1, 0);",
    )
]


async def db_of(store: tinystore.Store) -> tinystore.Database:
    return await store.database("app", migrations=SCHEMA)


# contract: SQL-01
async def test_tx_commits_on_return_and_rolls_back_on_raise(store: tinystore.Store) -> None:
    db = await db_of(store)

    async def ok(tx: tinystore.SqlTx) -> int:
        await tx.exec("insert into t (id, v) values (1, 'a')")
        # the transaction sees its own writes
        assert await tx.scalar("select v from t where id = 1") == "a"
        return 7

    assert await db.tx(ok) == 7
    assert await db.scalar("select v from t where id = 1") == "a"

    class Boom(Exception):
        pass

    async def bad(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (id, v) values (2, 'b')")
        raise Boom

    with pytest.raises(Boom):
        await db.tx(bad)
    assert await db.one("select * from t where id = 2") is None


# contract: SQL-01
@pytest.mark.parametrize(
    "killer",
    [
        "insert or rollback into t (id, v) values (1000, 'again')",  # a conflict that rolls back everything
        "insert into t (id, v) values (1001, 'boom')",  # a trigger's raise(rollback)
    ],
)
async def test_a_statement_that_rolls_back_the_transaction_ends_it(store: tinystore.Store, killer: str) -> None:
    """SQLite itself rolls the whole transaction back for ``INSERT OR ROLLBACK`` on a conflict or a trigger's
    ``RAISE(ROLLBACK)``: the transaction is over. What it wrote is gone, nothing after it runs in autocommit
    (no reader sees it), and ``db.tx`` raises even when ``fn`` caught the statement's error and returned."""
    db = await db_of(store)
    await db.exec(
        "create trigger if not exists t_boom before insert on t when new.v = 'boom' "
        "begin select raise(rollback, 'boom refused'); end"
    )
    await db.exec("insert into t (id, v) values (1000, 'first')")
    seen: list[BaseException] = []

    async def fn(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (id, v) values (1002, 'in the tx')")
        try:
            await tx.exec(killer)
        except tinystore.TinystoreError as exc:
            seen.append(exc)
        try:
            await tx.exec("insert into t (id, v) values (1003, 'after')")
        except tinystore.TinystoreError as exc:
            seen.append(exc)

    with pytest.raises(ConflictError) as info:
        await db.tx(fn)
    assert "rolled back" in str(info.value)
    assert len(seen) == 2 and "rolled back the whole transaction" in str(seen[0]), seen
    assert [r["id"] for r in await db.all("select id from t where id >= 1000 order by id")] == [1000]
    await db.exec("insert into t (id, v) values (1004, 'later')")  # the writer is free again
    assert await db.scalar("select count(*) from t where id >= 1000") == 2


# contract: SQL-01
async def test_tx_rolled_back_when_cancelled_and_never_visible(store: tinystore.Store) -> None:
    db = await db_of(store)
    inside = asyncio.Event()
    seen: list[Any] = []

    async def slow(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (id, v) values (3, 'c')")
        inside.set()
        await asyncio.sleep(30)

    task = asyncio.ensure_future(db.tx(slow))
    await inside.wait()
    # a reader never sees the uncommitted row
    seen.append(await db.one("select * from t where id = 3"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [None]
    assert await db.one("select * from t where id = 3") is None
    # the writer is free again
    await db.exec("insert into t (id, v) values (4, 'd')")
    assert await db.scalar("select count(*) from t where id = 4") == 1


# contract: SQL-03
async def test_eight_clients_read_then_update_balance(store: tinystore.Store) -> None:
    db = await db_of(store)

    async def bump(tx: tinystore.SqlTx) -> None:
        bal = await tx.scalar("select balance from acct where id = 1")
        await tx.exec("update acct set balance = ? where id = 1", bal + 1)

    async def client() -> None:
        for _ in range(200):
            await db.tx(bump)

    await asyncio.gather(*(client() for _ in range(8)))
    assert await db.scalar("select balance from acct where id = 1") == 1600


# contract: SQL-03
async def test_readers_not_blocked_by_a_writer_tx(store: tinystore.Store) -> None:
    db = await db_of(store)
    await db.exec("insert into t (id, v) values (10, 'old')")
    holding = asyncio.Event()
    release = asyncio.Event()

    async def hold(tx: tinystore.SqlTx) -> None:
        await tx.exec("update t set v = 'new' where id = 10")
        holding.set()
        await release.wait()

    task = asyncio.ensure_future(db.tx(hold))
    await holding.wait()
    # reads proceed on a snapshot while the writer is held
    assert await asyncio.wait_for(db.scalar("select v from t where id = 10"), 5) == "old"
    release.set()
    await task
    assert await db.scalar("select v from t where id = 10") == "new"


# contract: SQL-03
async def test_stalled_transaction_is_rolled_back_after_tx_idle(tmp_path: Path) -> None:
    limits = tinystore.Limits(tx_idle=0.3, tx_max=2.0)
    for mode in ("embedded", "private"):
        async with open_store(mode, tmp_path / mode, limits=limits) as store:
            db = await db_of(store)

            async def stall(tx: tinystore.SqlTx) -> None:
                await tx.exec("insert into t (id, v) values (20, 'x')")
                await asyncio.sleep(1.0)
                await tx.exec("insert into t (id, v) values (21, 'y')")

            with pytest.raises(tinystore.TimeoutError_) as info:
                await db.tx(stall)
            assert "tx_idle" in str(info.value), str(info.value)
            # the writer was let go: another writer goes on, nothing of the stalled tx is there
            await asyncio.wait_for(db.exec("insert into t (id, v) values (22, 'z')"), 5)
            assert await db.scalar("select count(*) from t where id in (20, 21)") == 0


# contract: SQL-03
async def test_read_only_tx_is_a_snapshot_and_refuses_writes(store: tinystore.Store) -> None:
    db = await db_of(store)
    await db.exec("insert into t (id, v) values (30, 1)")
    got: list[Any] = []

    async def report(tx: tinystore.SqlTx) -> None:
        got.append(await tx.scalar("select count(*) from t"))
        await db.exec("insert into t (id, v) values (31, 2)")  # another writer commits meanwhile
        got.append(await tx.scalar("select count(*) from t"))
        with pytest.raises(InvalidError):
            await tx.exec("insert into t (id, v) values (32, 3)")

    # db.exec inside a tx of the same db is refused only for write transactions; use a second handle
    other = store
    db2 = await other.database("app")

    async def report2(tx: tinystore.SqlTx) -> None:
        got.append(await tx.scalar("select count(*) from t"))
        task = asyncio.ensure_future(_exec_elsewhere(db2))
        await task
        got.append(await tx.scalar("select count(*) from t"))
        with pytest.raises(InvalidError):
            await tx.exec("insert into t (id, v) values (32, 3)")

    del report
    await db.tx(report2, read_only=True)
    assert got[0] == got[1]
    assert await db.scalar("select count(*) from t") == got[0] + 1


async def _exec_elsewhere(db: tinystore.Database) -> None:
    # runs in a new task: outside the read-only transaction's context
    await asyncio.get_running_loop().create_task(_plain_exec(db))


async def _plain_exec(db: tinystore.Database) -> None:
    import contextvars

    ctx = contextvars.Context()
    await asyncio.get_running_loop().create_task(db.exec("insert into t (id, v) values (31, 2)"), context=ctx)


VALUES: list[Any] = [
    None,
    0,
    1,
    -1,
    (1 << 63) - 1,
    -(1 << 63),
    1.5,
    -0.0,
    float("inf"),
    "",
    "plain",
    "nul\x00inside",
    "astral 🎉𝄞",
    "line\nbreak\r\n",
    b"",
    b"\x00\xff\x00",
    bytes(range(256)),
]


# contract: SQL-04
async def test_values_round_trip(store: tinystore.Store) -> None:
    db = await db_of(store)
    for i, v in enumerate(VALUES):
        await db.exec("insert into t (id, v) values (?, ?)", 100 + i, v)
    for i, v in enumerate(VALUES):
        got = await db.scalar("select v from t where id = ?", 100 + i)
        assert type(got) is type(v) and (got == v or (isinstance(v, float) and math.isnan(v))), (v, got)
    await db.exec("insert into t (id, v) values (?, ?)", 200, True)
    await db.exec("insert into t (id, v) values (?, ?)", 201, False)
    assert await db.scalar("select v from t where id = 200") == 1
    assert await db.scalar("select v from t where id = 201") == 0


# contract: SQL-04
async def test_values_sqlite_cannot_hold_are_refused(store: tinystore.Store) -> None:
    db = await db_of(store)
    for bad in (1 << 63, -(1 << 63) - 1, float("nan")):
        with pytest.raises(InvalidError):
            await db.exec("insert into t (id, v) values (?, ?)", 300, bad)
    with pytest.raises(InvalidError):
        await db.exec("insert into t (id, v) values (?, ?)", 300, object())
    assert await db.one("select * from t where id = 300") is None


# contract: SQL-05
async def test_migrations_apply_once_in_order_and_refuse_changes(store: tinystore.Store, tmp_path: Path) -> None:
    mig = tmp_path / "migrations"
    mig.mkdir()
    (mig / "002_b.sql").write_text("insert into log (step) values ('b');")
    (mig / "001_a.sql").write_text(
        "create table log (n integer primary key, step text);\ninsert into log (step) values ('a');"
    )
    db = await store.database("m", migrations=mig)
    assert [r["step"] for r in await db.all("select step from log order by n")] == ["a", "b"]
    await store.database("m", migrations=mig)  # again: nothing applied twice
    assert await db.scalar("select count(*) from log") == 2
    (mig / "003_c.sql").write_text("insert into log (step) values ('c');")
    await store.database("m", migrations=mig)
    assert await db.scalar("select count(*) from log") == 3
    (mig / "001_a.sql").write_text("create table log (n integer primary key);")
    with pytest.raises(ConflictError) as info:
        await store.database("m", migrations=mig)
    assert "001_a.sql" in str(info.value)


# contract: SQL-05
async def test_a_failing_migration_applies_nothing_of_itself(store: tinystore.Store) -> None:
    with pytest.raises(InvalidError) as info:
        await store.database(
            "m2", migrations=[("001.sql", "create table a (x);"), ("002.sql", "create table b (x);\nnot sql at all;")]
        )
    assert "002.sql" in str(info.value)
    db = await store.database("m2")
    assert await db.scalar("select count(*) from sqlite_master where name = 'b'") == 0
    assert await db.scalar("select count(*) from sqlite_master where name = 'a'") == 1


# contract: SQL-06
async def test_errors_keep_the_session_and_transaction(store: tinystore.Store) -> None:
    db = await db_of(store)
    with pytest.raises(InvalidError) as info:
        await db.exec("insert into nowhere values (1)")
    assert "no such table" in str(info.value)
    await db.exec("insert into t (id, v) values (400, 'x')")
    with pytest.raises(ConflictError) as cinfo:
        await db.exec("insert into t (id, v) values (400, 'dup')")
    assert "UNIQUE" in str(cinfo.value)
    assert await db.scalar("select v from t where id = 400") == "x"

    async def fn(tx: tinystore.SqlTx) -> None:
        with pytest.raises(InvalidError):
            await tx.exec("selec nonsense")
        with pytest.raises(ConflictError):
            await tx.exec("insert into t (id, v) values (400, 'again')")
        await tx.exec("insert into t (id, v) values (401, 'after errors')")

    await db.tx(fn)
    assert await db.scalar("select v from t where id = 401") == "after errors"


# contract: SQL-06
async def test_group_commit_failure_fails_only_its_statement(store: tinystore.Store) -> None:
    db = await db_of(store)
    stmts = [db.exec("insert into t (id, v) values (?, ?)", 500 + (i % 50), i) for i in range(100)]
    results = await asyncio.gather(*stmts, return_exceptions=True)
    ok = [r for r in results if isinstance(r, tinystore.Done)]
    failed = [r for r in results if isinstance(r, ConflictError)]
    assert len(ok) == 50 and len(failed) == 50
    assert await db.scalar("select count(*) from t where id between 500 and 549") == 50


@dataclasses.dataclass
class Item:
    id: int
    v: Any


class ItemS(msgspec.Struct):
    id: int
    v: Any


async def test_typed_rows_and_nested_calls(store: tinystore.Store) -> None:
    db = await db_of(store)
    await db.exec("insert into t (id, v) values (600, 'typed')")
    assert await db.one(Item, "select id, v from t where id = ?", 600) == Item(600, "typed")
    assert await db.all(ItemS, "select id, v from t where id = 600") == [ItemS(600, "typed")]
    done = await db.exec("insert into t (v) values ('r') returning id, v")
    assert done.rows[0][1] == "r" and done.changes == 1

    async def nested(tx: tinystore.SqlTx) -> None:
        with pytest.raises(InvalidError):
            await db.exec("insert into t (v) values ('x')")
        with pytest.raises(InvalidError):
            await db.tx(lambda t: None)

    await db.tx(nested)


async def test_bad_names_and_sql_are_named(store: tinystore.Store) -> None:
    with pytest.raises(InvalidError) as info:
        await store.database("Bad Name")
    assert "Bad Name" in str(info.value)
    db = await db_of(store)
    with pytest.raises(InvalidError):
        await db.one("insert into t (v) values (1)")
