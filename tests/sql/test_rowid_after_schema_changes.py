"""``Done.last_insert_rowid`` of a plain insert after the schema changed under the writer.

The writer skips setting its last insert rowid to 0 before a plain INSERT into an ordinary rowid table (every row
it changes is one it adds, so SQLite sets the value itself); it knows those tables from the schema, read again
after any schema change. Each check here makes the name of a rowid table name a WITHOUT ROWID table (or the
reverse) in a way the writer could miss, then inserts into it after another client's insert: an insert that
added no rowid row must give 0, never the other client's rowid."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store

MODES = ["embedded", "sidecar"]


async def app_with_other(store: tinystore.Store) -> tinystore.Database:
    """Database ``app`` with the table ``other`` that :func:`other_client_inserts` writes."""
    db = await store.database("app")
    await db.exec("create table other (id integer primary key, v)")
    return db


async def other_client_inserts(db: tinystore.Database) -> int:
    done = await db.exec("insert into other (v) values (1)")
    assert done.last_insert_rowid > 0
    return done.last_insert_rowid


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_a_table_made_anew_without_rowid_gives_0(mode: str, tmp_path: Path) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await app_with_other(store)
        await db.exec("create table t (k text primary key, v)")
        assert (await db.exec("insert into t (k, v) values ('a', 1)")).last_insert_rowid == 1
        await db.exec("drop table t")
        await db.exec("create table t (k text primary key, v) without rowid")
        await other_client_inserts(db)
        done = await db.exec("insert into t (k, v) values ('b', 2)")
        assert (done.changes, done.last_insert_rowid) == (1, 0)
        # and in one group commit: the drop, the make and the inserts sent together
        await db.exec("drop table t")
        await db.exec("create table t (k text primary key, v)")
        results = await asyncio.gather(
            db.exec("insert into t (k, v) values ('c', 3)"),
            db.exec("drop table t"),
            db.exec("create table t (k text primary key, v) without rowid"),
            db.exec("insert into other (v) values (2)"),
            db.exec("insert into t (k, v) values ('d', 4)"),
        )
        assert results[0].last_insert_rowid == 1
        assert results[3].last_insert_rowid > 1
        assert (results[4].changes, results[4].last_insert_rowid) == (1, 0)
        # a group whose write fails runs again, each write in a savepoint: its first insert, into the WITHOUT ROWID
        # table, then runs after the first run had made t a rowid table (rolled back since)
        await db.exec("create table u (x unique)")
        await db.exec("insert into u (x) values (1)")
        results = await asyncio.gather(
            db.exec("insert into t (k, v) values ('e', 5)"),
            db.exec("drop table t"),
            db.exec("create table t (k text primary key, v)"),
            db.exec("insert into t (k, v) values ('f', 6)"),
            db.exec("insert into u (x) values (1)"),
            return_exceptions=True,
        )
        assert isinstance(results[4], tinystore.ConflictError), results
        assert (results[0].changes, results[0].last_insert_rowid) == (1, 0), results
        assert results[3].last_insert_rowid == 1, results


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_a_rolled_back_transaction_that_made_a_rowid_table_leaves_the_old_one_known(
    mode: str, tmp_path: Path
) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await app_with_other(store)
        await db.exec("create table t (k text primary key, v) without rowid")

        async def remake(tx: tinystore.SqlTx) -> None:
            await tx.exec("drop table t")
            await tx.exec("create table t (k text primary key, v)")
            assert (await tx.exec("insert into t (k, v) values ('x', 1)")).last_insert_rowid == 1
            raise RuntimeError("changed my mind")

        with pytest.raises(RuntimeError):
            await db.tx(remake)
        await other_client_inserts(db)
        done = await db.exec("insert into t (k, v) values ('y', 2)")  # t is WITHOUT ROWID again
        assert (done.changes, done.last_insert_rowid) == (1, 0)


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_names_that_differ_past_ascii_are_two_tables(mode: str, tmp_path: Path) -> None:
    # SQLite folds only ASCII letters' case: "Ä" and "ä" are two tables (Python's lower() would make them one)
    async with open_store(mode, tmp_path / "s") as store:
        db = await app_with_other(store)
        await db.exec('create table "Ä" (id integer primary key, v)')
        await db.exec('create table "ä" (k text primary key, v) without rowid')
        await db.exec('create table "MiXed" (id integer primary key, v)')
        await other_client_inserts(db)
        done = await db.exec('insert into "ä" (k, v) values (?, ?)', "a", 1)
        assert (done.changes, done.last_insert_rowid) == (1, 0)
        assert (await db.exec('insert into "Ä" (v) values (1)')).last_insert_rowid == 1
        assert (await db.exec("insert into mixed (v) values (1)")).last_insert_rowid == 1
        assert (await db.exec('INSERT INTO "MIXED"(v) VALUES (2)')).last_insert_rowid == 2


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_a_view_and_a_before_insert_trigger_see_what_they_would_alone(mode: str, tmp_path: Path) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await app_with_other(store)
        await db.exec("create table t (id integer primary key, v)")
        await db.exec("create view tv as select id, v from t")
        await db.exec("create trigger tv_ins instead of insert on tv begin insert into t (v) values (new.v); end")
        await other_client_inserts(db)
        done = await db.exec("insert into tv (v) values (5)")  # the view's row is the trigger's, not its own
        assert done.last_insert_rowid == 0
        await db.exec("create table seen (id integer primary key, before_rowid)")
        await db.exec(
            "create trigger t_before before insert on t begin "
            "insert into seen (before_rowid) values (last_insert_rowid()); end"
        )
        await other_client_inserts(db)
        done = await db.exec("insert into t (v) values (6)")
        assert done.last_insert_rowid == await db.scalar("select max(id) from t")
        assert await db.scalar("select before_rowid from seen order by id desc limit 1") == 0


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_an_upsert_spelled_with_comments_inside_gives_0_on_its_update_path(mode: str, tmp_path: Path) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await app_with_other(store)
        await db.exec("create table t (id integer primary key, k text unique, v)")
        await db.exec("insert into t (k, v) values ('a', 1)")
        for spelling in (
            "insert into t (k, v) values ('a', 2) on conflict (k) do /* x */ update set v = excluded.v",
            "insert into t (k, v) values ('a', 3) on/**/conflict(k)do update set v = excluded.v",
            "INSERT INTO t (k, v) VALUES ('a', 4) ON CONFLICT DO\nUPDATE SET v = excluded.v",
        ):
            await other_client_inserts(db)
            done = await db.exec(spelling)
            assert (done.changes, done.last_insert_rowid) == (1, 0), spelling
        assert await db.scalar("select v from t where k = 'a'") == 4


# contract: SQL-04
@pytest.mark.parametrize("mode", MODES)
async def test_without_rowid_spelled_with_a_comment_and_names_past_ascii_give_0(mode: str, tmp_path: Path) -> None:
    """The writer read WITHOUT ROWID from a table's text, which may hold a comment between the words, and took a
    blank past ASCII after a name for one (SQLite takes it as part of the name): both tables were taken for
    rowid tables, and their inserts gave another client's rowid (trial CO)."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database(
            "app",
            migrations=[
                (
                    "001.sql",
                    "create table other (id integer primary key, v);\n"
                    "create table w (a primary key, b) without/* c */rowid;\n"
                    "create table w2 (a primary key, b) without -- c\n rowid;\n"
                    "create table u (id integer primary key, a);\n"
                    'create table "u\u00a0" (a primary key, b) without rowid;\n',
                )
            ],
        )
        for sql in (
            "insert into w (a, b) values (1, 2)",
            "insert into w2 (a, b) values (1, 2)",
            "insert into u\u00a0(a, b) values (1, 2)",
            "insert into u\u3000(a, b) values (1, 2)",
        ):
            await other_client_inserts(db)
            try:
                done = await db.exec(sql)
            except tinystore.InvalidError:  # (no table "u\u3000": SQLite says so)
                assert "\u3000" in sql
                continue
            assert (done.changes, done.last_insert_rowid) == (1, 0), sql
        assert (await db.exec("insert into u (a) values (1)")).last_insert_rowid == 1
