"""From trial CK: a tester breaking the fixes of trials CG-CJ (migrations' orphans table by table, checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tests.helpers import sqlite_file
from tinystore import InvalidError

from ..helpers import open_store

BASE = (
    "001.sql",
    "create table p (id integer, code text); create unique index pu on p (code); insert into p values (1, 'x');"
    "create table c (id integer primary key, code references p (code)); insert into c values (1, 'x');",
)


# contract: SQL-05
async def test_a_migration_that_leaves_a_foreign_key_uncheckable_is_refused(store: tinystore.Store) -> None:
    """Dropping the unique index a foreign key's parent columns had ("foreign key mismatch") took the child table
    out of the check: the migration's own orphan passed, and every later write to c failed."""
    db = await store.database("app", migrations=[BASE])
    step = ("002.sql", "insert into c values (2, 'nope'); drop index pu;")
    with pytest.raises(InvalidError, match=r"migration 002\.sql: it leaves table c with a foreign key SQLite cannot"):
        await store.database("app", migrations=[BASE, step])
    assert await db.scalar("select count(*) from c") == 1
    await db.exec("insert into c values (3, 'x')")


# contract: SQL-05
async def test_a_table_renamed_with_its_old_orphans_and_a_new_one_in_its_place_migrates(tmp_path: Path) -> None:
    """A child table holding orphans from before, renamed to keep its rows, and a new table made under its name:
    refused as if the orphans were the migration's (trial CK)."""
    sqlite_file(
        tmp_path / "s" / "sql" / "app.db",
        "create table p (id integer primary key); insert into p values (1);"
        "create table child (id integer primary key, pid int references p (id));"
        "insert into child values (1, 1), (2, 98), (3, 99);",
    )
    async with open_store("embedded", tmp_path / "s") as store:
        step = (
            "002.sql",
            "alter table child rename to child_archive;"
            "create table child (id integer primary key, pid int references p (id));",
        )
        db = await store.database("app", migrations=[step])
        assert await db.scalar("select count(*) from child_archive") == 3
        with pytest.raises(InvalidError, match=r"migration 003\.sql: it leaves rows .*: child row 7 -> p"):
            await store.database("app", migrations=[step, ("003.sql", "insert into child values (7, 5);")])


# contract: SQL-06
@pytest.mark.parametrize("sql", ["pragma 'main'.wal_checkpoint", "pragma 'main'.'wal_checkpoint'(passive)"])
async def test_a_checkpoint_with_a_quoted_schema_runs_through_exec(store: tinystore.Store, sql: str) -> None:
    """Refused as "it runs alone on the writer (db.exec ...)", which it was given to (trial CK)."""
    db = await store.database("app", migrations=[("1.sql", "create table t (x);")])
    done = await db.exec(sql)
    assert done.columns == ["busy", "log", "checkpointed"], done
