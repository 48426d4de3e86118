"""What one client's statement may not do to the connection every client of a database shares: run the engine's
own transaction statements (found prepared in sqlite3's statement cache), drop or write the engine's TEMP table,
defer the foreign keys of the other writes of its group commit. And writes under a constraint checked only at
COMMIT (INITIALLY DEFERRED) each get the outcome they would have alone."""

from __future__ import annotations

import asyncio

import pytest

import tinystore
from tinystore import ConflictError, InvalidError
from tinystore.engines.sql_text import has_deferred_constraint

T = [("1.sql", "create table t (id integer primary key, v text);")]


# contract: STORE-04
async def test_the_engines_own_statements_cannot_be_run_from_the_statement_cache(store: tinystore.Store) -> None:
    """SQLite authorizes a statement when it is prepared; sqlite3 keeps prepared statements by their text. A
    client that sent the very text of the engine's COMMIT (or of the inline reader's BEGIN) used to run it."""
    db = await store.database("app", migrations=T)
    await asyncio.gather(db.one("select 1"), db.one("select 2"))  # the inline reads' shared BEGIN is prepared
    for text in ("commit --ts", "rollback --ts", "begin immediate --ts", "savepoint g --ts", "release g --ts"):
        res = await asyncio.gather(
            db.exec("insert into t (v) values ('a')"),
            db.exec(text),
            db.exec("insert into t (v) values ('b')"),
            return_exceptions=True,
        )
        assert isinstance(res[1], InvalidError) and "run by the store" in res[1].message, (text, res)
        assert not isinstance(res[0], BaseException) and not isinstance(res[2], BaseException), res
        with pytest.raises(InvalidError):
            await db.one(text.replace("immediate ", ""))  # on the readers too
    assert await db.scalar("select count(*) from t") == 10

    async def commit_inside(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t (v) values ('in a tx that rolls back')")
        await tx.exec("commit --ts")

    with pytest.raises(InvalidError):
        await db.tx(commit_inside)
    assert await db.scalar("select count(*) from t") == 10
    # every read still sees every write that returned before it (no client's BEGIN holds an old snapshot)
    for i in range(3):
        await db.exec("insert into t (v) values (?)", f"after {i}")
        assert await db.scalar("select count(*) from t") == 11 + i


# contract: STORE-04
async def test_a_client_cannot_drop_or_write_the_writers_temp_table(store: tinystore.Store) -> None:
    """`drop table temp._tinystore_rowid` made every later insert of every client fail (no such table)."""
    db = await store.database("app", migrations=T)
    for text in (
        "drop table temp._tinystore_rowid",
        "insert into temp._tinystore_rowid (rowid) values (7)",
        "delete from temp._tinystore_rowid",
        "update temp._tinystore_rowid set x = 1",
        "alter table temp._tinystore_rowid add column y",
    ):
        with pytest.raises(InvalidError) as info:
            await db.exec(text)
        assert "TEMP" in info.value.message, text
    done = await db.exec("insert into t (v) values ('still works')")
    assert done.changes == 1 and done.last_insert_rowid == 1


# contract: STORE-04
async def test_a_client_cannot_set_a_pragma_of_the_shared_connections_temp_schema(store: tinystore.Store) -> None:
    """Trial HQ: `pragma temp.user_version = 3` was taken on the writer's connection, which every client shares."""
    db = await store.database("app", migrations=T)
    for text in ("pragma temp.user_version = 3", "pragma temp.page_size = 8192", "PRAGMA TEMP.application_id=7"):
        with pytest.raises(InvalidError, match="TEMP schema") as info:
            await db.exec(text)
        assert "temp." in info.value.message, text
    assert await db.scalar("pragma temp.user_version") == 0  # (reading it is fine)


# contract: SQL-06
async def test_defer_foreign_keys_in_exec_is_refused_and_defers_no_other_write(store: tinystore.Store) -> None:
    """An exec is a transaction of its own, committed with others' writes: `PRAGMA defer_foreign_keys = on` sent
    through exec deferred the immediate foreign keys of the writes it shared a commit with."""
    db = await store.database(
        "app",
        migrations=[
            (
                "1.sql",
                "create table parent (id integer primary key);\n"
                "create table child (id integer primary key, pid integer references parent (id));",
            )
        ],
    )
    res = await asyncio.gather(
        db.exec("pragma defer_foreign_keys = on"),
        db.exec("insert into child (id, pid) values (1, 5)"),  # no parent 5: fails at once
        db.exec("insert into parent (id) select 5 where exists (select 1 from child where pid = 5)"),
        return_exceptions=True,
    )
    assert isinstance(res[0], InvalidError) and "defer_foreign_keys" in res[0].message and "db.tx" in res[0].message
    assert isinstance(res[1], ConflictError) and "FOREIGN KEY" in res[1].message, res
    assert await db.all("select * from child") == [] and await db.all("select * from parent") == []

    async def deferred(tx: tinystore.SqlTx) -> None:  # where it means something, it stays allowed
        await tx.exec("pragma defer_foreign_keys = on")
        await tx.exec("insert into child (id, pid) values (2, 6)")
        await tx.exec("insert into parent (id) values (6)")

    await db.tx(deferred)
    assert await db.scalar("select count(*) from child") == 1


# contract: SQL-06
async def test_a_write_that_breaks_a_deferred_constraint_fails_though_another_write_of_its_group_mends_it(
    store: tinystore.Store,
) -> None:
    """SQLite checks an INITIALLY DEFERRED foreign key at COMMIT: in a shared commit, a write that broke it passed
    when a later write of the group happened to undo the breakage. Alone, it fails; so it must in the group."""
    db = await store.database(
        "app",
        migrations=[
            (
                "1.sql",
                "create table parent (id integer primary key);\n"
                "create table child (id integer primary key, pid integer references parent (id) "
                "deferrable initially deferred);",
            )
        ],
    )
    for _ in range(3):
        a, b = await asyncio.gather(
            db.exec("insert into child (pid) values (11) returning id"),  # no parent 11
            db.exec("delete from child where pid = 11 returning id"),
            return_exceptions=True,
        )
        assert isinstance(a, ConflictError) and "FOREIGN KEY" in a.message, (a, b)
        assert not isinstance(b, BaseException) and b.rows == [], b
    assert await db.all("select * from child") == []


def test_deferred_constraints_are_found_in_the_schema_text_but_not_in_comments_or_strings() -> None:
    assert has_deferred_constraint(["create table c (p references x (id) DEFERRABLE\n  Initially  Deferred)"])
    assert not has_deferred_constraint(["create table c (p references x (id) deferrable initially immediate)"])
    assert not has_deferred_constraint(["create table c (p -- initially deferred\n)"])
    assert not has_deferred_constraint(["create table c (p /* initially deferred */)"])
    assert not has_deferred_constraint(["create table c (p default 'initially deferred')"])
    assert not has_deferred_constraint(["create table c (initially_deferred_at integer)"])
