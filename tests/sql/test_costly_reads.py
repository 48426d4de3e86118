"""Reads that cost the server much in one step (trial S): a read runs on the server's event loop only while it is
cheap, and every result is measured as it is fetched.

- A value SQLite makes in one opcode (``randomblob``, ``zeroblob``, ``printf``) cannot be cut by the progress
  handler: on the loop it is kept to ``INLINE_VALUE_BYTES``, a longer statement to ``INLINE_SQL_BYTES``; past
  them a reader thread runs the read (counted in ``reads_moved``), and everyone else's calls go on meanwhile.
  ``printf`` gives NULL rather than an error past the limit, so a read that calls it always runs on a reader.
- No value may be over ``sql_result_bytes``: SQLite stops making it (it made 1 GB before).
- A result over ``sql_result_bytes`` fails as soon as it is, not once all of it is in the server's memory.
- The texts a client sends are scanned in linear time, and long ones are not kept in the server's caches.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tinystore import LimitError
from tinystore.engines import sql as engine_sql
from tinystore.engines import sql_text

from ..helpers import open_store


def moved(status: dict[str, object]) -> int:
    databases = status["databases"]
    assert isinstance(databases, dict)
    return int(databases["app"].get("reads_moved", 0))


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_large_value_or_a_long_statement_is_read_off_the_loop(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        assert await db.scalar("select length(randomblob(1000))") == 1000
        before = moved(await store.status())
        big = engine_sql.INLINE_VALUE_BYTES * 2
        assert await db.scalar("select length(randomblob(?))", big) == big
        long_text = "select 7 -- " + "x" * engine_sql.INLINE_SQL_BYTES
        assert await db.scalar(long_text) == 7  # (never tried on the loop: not counted)
        assert moved(await store.status()) == before + 1
        # printf gives NULL (no error) for a text over a connection's limit: it always runs on a reader
        assert await db.scalar(f"select length(printf('%.*c', {big}, 'a'))") == big


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_no_value_is_made_over_the_result_limit(tmp_path: Path, mode: str) -> None:
    limits = tinystore.Limits(sql_result_bytes=4 << 20)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (b blob)")])
        for call in (
            db.scalar("select length(randomblob(5000000))"),
            db.scalar("select length(zeroblob(5000000))"),
        ):
            with pytest.raises(LimitError, match=r"over 4194304 bytes \(the limit sql_result_bytes"):
                await call
        with pytest.raises(LimitError, match=r"over 4194304 bytes \(the limit sql_result_bytes"):
            await db.exec("insert into t values (randomblob(5000000))")  # nor a write
        assert await db.scalar("select count(*) from t") == 0
        assert await db.scalar("select length(randomblob(3000000))") == 3_000_000


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_result_fails_once_it_is_over_the_limit_not_once_it_is_whole(tmp_path: Path, mode: str) -> None:
    # rows of 1,000 bytes, then at row 5,000 one SQLite cannot make (integer overflow): fetched whole, the read
    # failed on that row; measured as fetched, it is over the 100 kB limit long before it
    limits = tinystore.Limits(sql_result_bytes=100_000)
    sql = (
        "with recursive c(v) as (select 1 union all select v + 1 from c limit 6000) "
        "select case when v < 5000 then randomblob(1000) else abs(-9223372036854775807 - 1 + 0 * v) end from c"
    )
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app")
        with pytest.raises(LimitError, match="the result is over 100000 bytes"):
            await db.all(sql)
        assert await db.scalar("select 1") == 1


def test_scans_of_a_statement_are_linear_and_long_texts_are_not_kept() -> None:
    # 15 MB of lone ':' took the loop 4 s (one Python step each); 10^6 comments before a keyword were quadratic
    assert sql_text.named_placeholder("select 1 " + ":" * 2_000_000) is None
    assert sql_text.named_placeholder("select ::::x") == ":x"
    assert sql_text.named_placeholder("select '::', @@y") == "@y"
    assert sql_text.changes_schema("/**/" * 200_000 + "create table x (a)")
    assert sql_text.changes_schema(" ; /* a */ ;\n-- b\n alter table t add column c")
    assert not sql_text.changes_schema("/* create */ select 1")
    assert sql_text._skip_comments("/* open") == ""
    long_text = "insert into t values (1) -- " + "x" * 10_000
    judges = (sql_text.is_insert, sql_text.changes_schema, sql_text.is_vacuum, sql_text.defers_foreign_keys)
    sizes = [fn.cache.cache_info().currsize for fn in judges]  # type: ignore[attr-defined]
    assert sql_text.is_insert(long_text) and not sql_text.changes_schema(long_text)
    assert not sql_text.is_vacuum(long_text) and not sql_text.defers_foreign_keys(long_text)
    assert [fn.cache.cache_info().currsize for fn in judges] == sizes  # type: ignore[attr-defined]
    assert sql_text.is_insert("insert into t values (2)")
    assert sql_text.is_insert.cache.cache_info().currsize >= 1  # type: ignore[attr-defined]


async def test_connections_that_ran_many_long_statements_are_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sqlite3 keeps each connection's last 256 statements prepared, texts and all: 60 distinct 8 MiB texts left
    # the server at 1.5 GB for good. A connection that ran more than RECYCLE_BYTES of long texts is replaced
    monkeypatch.setattr(engine_sql, "RECYCLE_BYTES", 150_000)
    pad = "x" * 70_000  # past INLINE_SQL_BYTES: read on a reader thread
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(readers=1)) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (id integer primary key, a)")])
        for i in range(3):
            assert await db.scalar(f"select {i} -- {pad}") == i
            done = await db.exec(f"insert into t (a) values ({i}) -- {pad}")
            assert done.last_insert_rowid == i + 1
        for _ in range(200):  # (a thread replaces its connection after it answered)
            stats = (await store.status())["databases"]["app"]
            if stats.get("connections_recycled", 0) >= 2:
                break
            await asyncio.sleep(0.01)
        assert stats["connections_recycled"] >= 2, stats
        # the new writer is a writer as before: last_insert_rowid reset, authorizer, limits
        assert (await db.exec("insert into t (a) values ('z')")).last_insert_rowid == 4
        assert (await db.exec("update t set a = 1 where id = 1")).last_insert_rowid == 0
        with pytest.raises(tinystore.InvalidError, match="belongs to the store"):
            await db.exec("delete from _tinystore_migrations")
        assert await db.scalar("select count(*) from t") == 4


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_functions_that_work_long_in_one_step_run_off_the_loop(tmp_path: Path, mode: str) -> None:
    # trial V: LIKE, instr, replace over texts under 1 MiB took the loop 3-11 s in one SQLite step; printf spelled
    # "printf"(...) or called from a view gave NULL on the loop's connection. The loop's connection refuses these
    # functions (views included), and the read runs on a reader thread
    views = "create view pv as select printf('%.*c', 2000000, 'a') as v; create view lv as select 'abc' like 'a%' as l"
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", views)])
        reads = [
            ("select 'abc' like 'a%'", 1),
            ("select 'abc' glob 'a*'", 1),
            ("select instr('abc', 'c')", 3),
            ("select replace('abc', 'b', 'x')", "axc"),
            ("select trim('  a  ')", "a"),
            ("select length(\"printf\"('%.*c', 2000000, 'a'))", 2_000_000),
            ("select length(printf/**/('%.*c', 2000000, 'a'))", 2_000_000),
            ("select length(v) from pv", 2_000_000),
            ("select l from lv", 1),
        ]
        for sql, want in reads:
            before = moved(await store.status())
            assert await db.scalar(sql) == want, sql
            assert moved(await store.status()) == before + 1, sql
            assert await db.scalar(sql) == want  # known now: straight to a reader
        before = moved(await store.status())
        assert await db.scalar("select 1") == 1
        assert moved(await store.status()) == before  # the usual read stays on the loop


async def test_alter_table_rename_and_drop_column_work(tmp_path: Path) -> None:
    # trial V: refused everywhere, migrations included, as "TEMP tables ... are refused": SQLite rewrites the TEMP
    # schema itself in a rename (the writer has a TEMP table)
    migrations = [
        ("001.sql", "create table a (x, y, z)"),
        ("002.sql", "alter table a rename to b; alter table b rename column y to w; alter table b drop column z"),
    ]
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=migrations)
        await db.exec("alter table b rename to c")
        await db.exec("insert into c (x, w) values (1, 2)")
        assert await db.all("select * from c") == [{"x": 1, "w": 2}]
        with pytest.raises(tinystore.InvalidError, match=r"may not be modified|not allowed here"):
            await db.exec("update sqlite_temp_master set sql = 'x'")


async def test_no_value_over_the_result_limit_in_a_write_either(tmp_path: Path) -> None:
    # trial W: with SQLite's own 1 GB limit on the writer, a read sent through exec (it runs on the writer) made
    # 900 MB; printf past the limit gives NULL there too, as SQLite does (docs/sql.md says so)
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(sql_result_bytes=1 << 20)) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (v)")])
        with pytest.raises(LimitError, match="over 1048576 bytes"):
            await db.exec("select length(randomblob(2000000))")
        with pytest.raises(LimitError, match="over 1048576 bytes"):
            await db.exec("insert into t values (zeroblob(2000000))")
        await db.exec("insert into t values (printf('%.*c', 2000000, 'a'))")
        assert await db.scalar("select v is null from t") == 1


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_large_rows_are_measured_a_few_at_a_time(tmp_path: Path, mode: str) -> None:
    # trial V: a result was measured every 1,024 rows: 600 rows of 1 MB were in memory before the LimitError.
    # Rows of 100 kB under a 1 MB limit, then at row 50 one SQLite cannot make: measured as they come, the
    # result fails on its size first
    sql = (
        "with recursive c(v) as (select 1 union all select v + 1 from c limit 60) "
        "select case when v < 50 then randomblob(100000) else abs(-9223372036854775807 - 1 + 0 * v) end from c"
    )
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(sql_result_bytes=1_000_000)) as store:
        db = await store.database("app")
        with pytest.raises(LimitError, match="the result is over 1000000 bytes"):
            await db.all(sql)


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_long_run_of_function_calls_is_not_run_on_the_loop(tmp_path: Path, mode: str) -> None:
    # trial W: SQLite looks at its progress handler only where a statement jumps, so 1,899 upper(substr(?1, k))
    # in one select list held the loop 17 s. On the loop a statement is at most INLINE_SQL_BYTES and a value at
    # most INLINE_VALUE_BYTES: such a read runs on a reader, and checkpoints and integrity checks do too
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        calls = ",".join(f"length(upper(substr(?1, {k})))" for k in range(1, 300))
        before = moved(await store.status())
        row = await db.one(f"select {calls}", "a" * 1000)
        assert row is not None and len(row) == 299
        assert await db.scalar("select length(upper(?1))", "a" * (engine_sql.INLINE_VALUE_BYTES * 2)) == 32768
        assert (await db.all("pragma quick_check"))[0]["quick_check"] == "ok"
        assert moved(await store.status()) == before + 2  # (the long text never tries the loop)


async def test_the_prepared_statements_of_the_store_are_not_readable(tmp_path: Path) -> None:
    # trial W: sqlite_stmt showed every cached statement: other clients' SQL, and the engines' marks, with which
    # a client reused the engines' cached COMMIT and ROLLBACK (acknowledged writes of others were lost)
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (a)")])
        await db.exec("insert into t values (1)")
        for call in (db.all("select sql from sqlite_stmt"), db.exec("select sql from sqlite_stmt")):
            with pytest.raises(tinystore.InvalidError, match="sqlite_stmt is refused"):
                await call


async def test_sqlite_memory_is_bounded_for_the_store(tmp_path: Path) -> None:
    # trial W: one read of 1,899 constant expressions over a 1 MB parameter took 5.5 GB (SQLite keeps each in a
    # register of its own); SQLite's hard heap limit (Limits.sql_memory_bytes) makes it a LimitError
    limits = tinystore.Limits(sql_memory_bytes=200 << 20)
    async with open_store("embedded", tmp_path / "s", limits=limits) as store:
        db = await store.database("app")
        calls = ",".join(f"length(upper(substr(?1, {k})))" for k in range(1, 400))
        with pytest.raises(LimitError, match=r"Limits.sql_memory_bytes, 209715200"):
            await db.one(f"select {calls}", "a" * 1_000_000)
        assert await db.scalar("select 1") == 1
    async with open_store("embedded", tmp_path / "s2"):
        pass  # (the next store sets its own, default, limit: the heap limit is the process's)
