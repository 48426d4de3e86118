"""Each write's outcome is its own, as SQLite gives it for the statement alone: a RETURNING row that cannot be
read fails only its write (not the group commit it shares), and `changes` counts a statement's own rows whether
or not it begins with WITH."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import tinystore
from tinystore import ConflictError, InvalidError

from ..helpers import open_store


# contract: SQL-06
async def test_a_returning_row_that_is_not_utf8_fails_its_write_alone(store: tinystore.Store) -> None:
    """The failed fetch left SQLite's statement running, so the group's savepoint could not be released and
    every write of the group failed with "cannot release savepoint - SQL statements in progress"."""
    db = await store.database("app", migrations=[("1.sql", "create table t (id integer primary key, b text unique);")])
    await db.exec("insert into t (id, b) values (1, 'one')")
    a, b, c, d = await asyncio.gather(
        db.exec("insert into t (id, b) values (2, 'two')"),
        db.exec("insert into t (id, b) values (3, 'one')"),  # UNIQUE: the group runs again, with savepoints
        db.exec("insert into t (id, b) values (4, cast(x'ff' as text)) returning b"),
        db.exec("insert into t (id, b) values (5, 'five')"),
        return_exceptions=True,
    )
    assert not isinstance(a, BaseException) and not isinstance(d, BaseException), (a, d)
    assert isinstance(b, ConflictError), b
    assert isinstance(c, InvalidError) and "UTF-8" in c.message, c
    assert [r["id"] for r in await db.all("select id from t order by id")] == [1, 2, 5]
    # a read of such a text fails alone too, and the next reads go on
    with pytest.raises(InvalidError):
        await db.all("select cast(x'ff' as text) as b")
    with pytest.raises(InvalidError):
        await db.one("select cast(x'fe' as text) as b")
    assert await db.scalar("select count(*) from t") == 3

    async def in_tx(tx: tinystore.SqlTx) -> None:
        with pytest.raises(InvalidError):
            await tx.exec("insert into t (id, b) values (6, cast(x'ff' as text)) returning b")
        await tx.exec("insert into t (id, b) values (7, 'seven')")

    await db.tx(in_tx)
    assert [r["id"] for r in await db.all("select id from t order by id")] == [1, 2, 5, 7]


# contract: SQL-06
async def test_changes_of_a_statement_under_with_leaves_out_its_triggers_rows(store: tinystore.Store) -> None:
    schema = (
        "create table t (id integer primary key, a int);\n"
        "create table audit (id integer primary key, what text);\n"
        "create trigger t_ai after insert on t begin insert into audit (what) values ('ins ' || new.id); end;"
    )
    db = await store.database("app", migrations=[("1.sql", schema)])
    plain = "insert into t (a) values (1), (2)"
    with_ = "with c(x) as (values (1), (2)) insert into t (a) select x from c"
    update = "with c(x) as (select 1) update t set a = a + x from c"
    reference = sqlite3.connect(":memory:")
    reference.executescript(schema)
    for sql in (plain, with_, update):
        expected = reference.execute(sql).rowcount if sql is plain else _changes_of(reference, sql)
        assert (await db.exec(sql)).changes == expected == (4 if sql is update else 2), sql
    # a WITH that changes nothing counts 0, not the rows of the statement before it
    await db.exec(plain)
    assert (await db.exec("with c(x) as (select 1) delete from t where a in (select -x from c)")).changes == 0


def _changes_of(conn: sqlite3.Connection, sql: str) -> int:
    conn.execute(sql)
    row = conn.execute("select changes()").fetchone()
    return int(row[0])


# contract: SQL-01
async def test_tx_reads_refuse_a_write_and_the_transaction_goes_on(store: tinystore.Store) -> None:
    """tx.one/all/scalar ran a write on the writer with none of tx.exec's care: a failing one kept its first rows
    (INSERT OR FAIL), and giving up on the call stopped the write, which rolled the whole transaction back."""
    db = await store.database("app", migrations=[("1.sql", "create table t (id integer primary key, b text unique);")])

    async def fn(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (b) values ('y')")
        for call in (tx.one, tx.all, tx.scalar):
            with pytest.raises(InvalidError) as info:
                await call("insert or fail into t (b) values ('new'), ('y') returning id")
            assert "reads" in info.value.message
        assert await tx.scalar("select count(*) from t") == 1  # reads still run, and see the tx's own writes
        await tx.exec("insert into t (b) values ('z')")

    await db.tx(fn)
    assert [r["b"] for r in await db.all("select b from t order by id")] == ["y", "z"]


# contract: SQL-06
async def test_an_autoincrement_table_at_the_largest_rowid_is_a_conflict_not_a_full_disk(
    store: tinystore.Store,
) -> None:
    db = await store.database(
        "app", migrations=[("1.sql", "create table t (id integer primary key autoincrement, v);")]
    )
    await db.exec("insert into t (id, v) values (?, 1)", 2**63 - 1)
    with pytest.raises(ConflictError) as info:
        await db.exec("insert into t (v) values (2)")
    assert "table t is AUTOINCREMENT" in info.value.message and "not the disk" in info.value.message
    assert await db.scalar("select count(*) from t") == 1


# contract: SQL-01
async def test_a_migrations_folder_that_does_not_exist_is_named(tmp_path: Path) -> None:
    """Trial HT: `migrations="./migrations"` with no such folder said "migrations is not a folder of .sql files",
    neither where it looked nor that nothing was there."""
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(tinystore.InvalidError) as info:
            await store.database("app", migrations=tmp_path / "migrations")
        assert f"there is no folder {tmp_path / 'migrations'}" in info.value.message, info.value.message
        (tmp_path / "file.sql").write_text("create table t (id integer primary key);")
        with pytest.raises(tinystore.InvalidError, match=r"is not a folder of \.sql files"):
            await store.database("app", migrations=tmp_path / "file.sql")
