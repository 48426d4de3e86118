"""From trial CF: a new user bringing an application's existing SQLite database into a store."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store, sqlite_file
from tinystore import InvalidError, UnavailableError
from tinystore.engines.sql_errors import sql_error

OLD = (
    "create table posts (id integer primary key, body text);\n"
    "create table tags (post_id int not null references posts(id), tag text not null, primary key (post_id, tag))"
    " without rowid;\n"
    "create table notes (post_id int references posts(id), text text);\n"  # (no INTEGER PRIMARY KEY: rowids move)
    "insert into posts values (1, 'a'), (2, 'b');\n"
    "insert into tags values (1, 'x'), (99, 'orphan from before');\n"
    "insert into notes values (2, 'n1'), (2, 'n2'), (2, 'n3'), (98, 'orphan from before'), (1, 'n5');\n"
)
REBUILD_NOTES = (
    "create table notes_new (post_id int references posts(id), text text not null);\n"
    "insert into notes_new (post_id, text) select post_id, text from notes order by rowid desc;\n"
    "drop table notes;\n"
    "alter table notes_new rename to notes;"
)


def _bring(directory: Path) -> None:
    """An application's database, written with foreign keys off (sqlite3's default): it holds orphans."""
    sqlite_file(directory / "sql" / "app.db", OLD)


# contract: SQL-05
@pytest.mark.parametrize("open_first", [False, True])
@pytest.mark.parametrize("text", [REBUILD_NOTES, "alter table notes rename to post_notes;"], ids=["rebuild", "rename"])
async def test_orphans_from_before_that_move_do_not_fail_a_migration(
    tmp_path: Path, open_first: bool, text: str
) -> None:
    """SQLite's own rebuild gives the old orphan another rowid, and a rename another table name: matched row by row
    against those from before, the migration was blamed for them and failed."""
    _bring(tmp_path / "s")
    async with open_store("embedded", tmp_path / "s") as store:
        if open_first:
            await store.database("app")
        db = await store.database("app", migrations=[("002.sql", text)])
        assert await db.scalar("select count(*) from sqlite_master where name in ('notes', 'post_notes')") == 1


# contract: SQL-05
@pytest.mark.parametrize("open_first", [False, True])
async def test_a_new_orphan_in_a_without_rowid_table_fails_a_migration_beside_an_old_one(
    tmp_path: Path, open_first: bool
) -> None:
    """A WITHOUT ROWID table's orphans have no rowid (NULL): matched row by row, a new one looked like the old one
    and the migration went through."""
    _bring(tmp_path / "s")
    async with open_store("embedded", tmp_path / "s") as store:
        if open_first:
            await store.database("app")
        with pytest.raises(InvalidError) as info:
            await store.database(
                "app", migrations=[("002.sql", "delete from notes where post_id = 1; delete from posts where id = 1;")]
            )
        assert (
            "it leaves rows whose foreign key finds no parent: tags (a WITHOUT ROWID table) -> posts"
            in info.value.message
        )
        db = await store.database("app")
        assert await db.scalar("select count(*) from posts") == 2


# contract: SQL-05
async def test_a_migration_of_a_database_open_already_has_no_time_limit(tmp_path: Path) -> None:
    """At a database's open a migration ran under no time limit; given to a database open already, the same one
    failed at statement_timeout, or tx_max: a deploy that rebuilds a big table while a sidecar runs."""
    limits = tinystore.Limits(statement_timeout=0.05, tx_max=0.2, tx_idle=0.1)
    slow = (
        "create table big as with recursive c(v) as (select 1 union all select v + 1 from c where v < 400000) "
        "select v, randomblob(16) as b from c;\n"
        "create index big_b on big (b);\n"
        "create table big2 as select * from big order by b;"
    )
    async with open_store("private", tmp_path / "s", limits=limits) as store:
        db = await store.database("app")
        await store.database("app", migrations=[("001_big.sql", slow)])
        assert await db.scalar("select count(*) from big2") == 400000
        with pytest.raises(tinystore.TimeoutError_):  # (what is not a migration keeps its limits)
            await db.tx(lambda tx: tx.exec("create table big3 as select * from big order by b"))


def test_a_file_another_process_holds_locked_is_unavailable_not_invalid(tmp_path: Path) -> None:
    """Another process holding the file's lock (an old application still running): the write waited its minute,
    then said InvalidError, which means bad SQL."""
    path = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("pragma journal_mode = wal")
        holder.execute("create table t (x)")
        holder.execute("begin immediate")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as store_side:
            with pytest.raises(sqlite3.OperationalError) as raised:
                store_side.execute("begin immediate")
        holder.execute("rollback")
    err = sql_error("app", raised.value)
    assert type(err) is UnavailableError, err
    assert err.message.startswith("database app: database is locked (SQLITE_BUSY): another process holds")


async def test_a_backup_names_a_file_with_no_database_name(tmp_path: Path) -> None:
    """``App.db`` (an application's name) was left out of every backup, and named nowhere."""
    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (x)")
        for name in ("App.db", "my app.sqlite3"):
            with contextlib.closing(sqlite3.connect(tmp_path / "s" / "sql" / name)) as conn:
                conn.execute("create table t (x)")
        result = await store.backup(tmp_path / "copy")
    assert set(result["databases"]) == {"app"}
    assert set(result["skipped"]) == {"App.db", "my app.sqlite3"}
    assert "its name is no database name" in result["skipped"]["App.db"]
