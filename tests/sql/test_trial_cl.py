"""Trial CL (differential testing against plain sqlite3): what it found, each as a check over the ways of reaching
the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store

MODES = ["embedded", "sidecar"]


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_changes_in_a_transactions_insert_is_its_last_statements_count(mode: str, tmp_path: Path) -> None:
    """The writer set its last insert rowid to 0 before every insert, by a write of its own: SQL's ``changes()``
    in the insert then gave 1, not the update's 3 (an audit row of how many rows a statement changed)."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (x)")
        await db.exec("create table log (what, n)")

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values (1), (2), (3)")
            await tx.exec("insert into log (what, n) values ('insert', changes())")
            await tx.exec("update t set x = x + 1")
            await tx.exec("insert into log (what, n) values ('update', changes())")
            await tx.exec("delete from t where x > 2")
            await tx.exec("insert into log (what, n) select 'delete', changes()")

        await db.tx(fn)
        assert await db.all("select what, n from log order by rowid") == [
            {"what": "insert", "n": 3},
            {"what": "update", "n": 3},
            {"what": "delete", "n": 2},
        ]


@pytest.mark.parametrize("mode", MODES)
async def test_a_memoryview_of_any_layout_is_a_blob_and_a_released_one_is_named(mode: str, tmp_path: Path) -> None:
    """Embedded, ``exec`` of a memoryview that is not contiguous raised a bare ``BufferError`` (measuring it for the
    frame limit), where ``scalar`` and the sidecar took its bytes; a released one was a bare ``ValueError``."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table b (v blob)")
        every_other = memoryview(b"abcdef")[::2]
        backwards = memoryview(b"xyz")[::-1]
        assert await db.scalar("select ?", every_other) == b"ace"
        assert (await db.exec("select ?", every_other)).rows == [[b"ace"]]
        await db.exec("insert into b (v) values (?)", backwards)
        assert await db.scalar("select v from b") == b"zyx"
        released = memoryview(b"gone")
        released.release()
        for call in (db.scalar, db.exec):
            with pytest.raises(tinystore.InvalidError) as info:
                await call("select ?", released)
            assert "parameter 1" in info.value.message and "released" in info.value.message
        assert await db.scalar("select count(*) from b") == 1


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_changes_after_an_insert_that_added_no_row_is_0(mode: str, tmp_path: Path) -> None:
    """After an insert that added nothing, the writer set its last rowid back to the transaction's by a write of
    its own, which SQL's ``changes()`` then counted: 1 where a connection of your own says 0 (trial CO)."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (a)")
        await db.exec("create table uq (k unique)")
        await db.exec("create table audit (id integer primary key, n)")
        await db.exec("insert into uq (k) values ('x')")

        async def fn(tx: tinystore.SqlTx) -> list[Any]:
            first = await tx.exec("insert into t (a) values (1)")
            ignored = await tx.exec("insert or ignore into uq (k) values ('x')")
            await tx.exec("insert into audit (n) values (changes())")
            nothing = await tx.exec("insert into t (a) select 1 where 0")
            await tx.exec("insert into audit (n) values (changes())")
            child = await tx.exec("insert into audit (n) values (last_insert_rowid())")
            last = await tx.scalar("select last_insert_rowid()")
            return [first.last_insert_rowid, ignored.last_insert_rowid, nothing.last_insert_rowid, child, last]

        first, ignored, nothing, child, last = await db.tx(fn)
        assert (first, ignored, nothing) == (1, 0, 0)
        assert await db.all("select n from audit order by id") == [{"n": 0}, {"n": 0}, {"n": 2}]
        assert last == child.last_insert_rowid == 3
