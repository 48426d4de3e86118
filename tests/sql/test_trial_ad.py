"""Trial AD (differential testing against plain sqlite3): what it found, each as a check over the ways of reaching
the store."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store

MODES = ["embedded", "sidecar"]


@pytest.mark.parametrize("mode", MODES)
async def test_explain_does_not_get_a_deferring_pragma_past_exec(mode: str, tmp_path: Path) -> None:
    # contract: SQL-03
    """``explain pragma defer_foreign_keys = on`` sets the flag when prepared, and it lasted to the group's
    COMMIT: another client's orphan insert was accepted because a third write added the parent."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table p (id integer primary key)")
        await db.exec("create table c (pid integer references p (id))")
        for i, sql in enumerate(
            [
                "explain pragma defer_foreign_keys = on",
                "EXPLAIN QUERY PLAN pragma defer_foreign_keys = 1",
                "explain /* x */ pragma main.defer_foreign_keys = on",
            ]
        ):
            explained, orphan, parent = await asyncio.gather(
                db.exec(f"{sql} -- {i}"),
                db.exec("insert into c (pid) values (?)", 100 + i),
                db.exec("insert into p (id) values (?)", 100 + i),
                return_exceptions=True,
            )
            assert isinstance(explained, tinystore.InvalidError) and "defer_foreign_keys" in str(explained)
            assert isinstance(orphan, tinystore.ConflictError), orphan
            assert isinstance(parent, tinystore.Done)


@pytest.mark.parametrize("mode", MODES)
async def test_last_insert_rowid_in_a_transaction_is_its_own_last_insert(mode: str, tmp_path: Path) -> None:
    """The engine set the writer's last insert rowid to 0 before each insert (for ``Done.last_insert_rowid``), so
    ``insert into child (parent_id) values (last_insert_rowid())`` stored 0, silently."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table parent (id integer primary key, name)")
        await db.exec("create table child (id integer primary key, parent_id, note)")
        await db.exec("create table u (x unique)")

        async def fill(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into parent (name) values ('a')")
            await tx.exec("insert into parent (name) values ('b')")
            done = await tx.exec("insert into child (parent_id, note) values (last_insert_rowid(), 'x')")
            assert done.last_insert_rowid == 1
            assert await tx.scalar("select last_insert_rowid()") == 1
            await tx.exec("insert into u (x) values (1)")  # rowid 1 of u
            await tx.exec("insert into parent (name) values ('c')")  # rowid 3
            ignored = await tx.exec("insert or ignore into u (x) values (1)")  # adds no row
            assert ignored.last_insert_rowid == 0
            assert await tx.scalar("select last_insert_rowid()") == 3  # as SQLite keeps it

        await db.tx(fill)
        assert await db.all("select parent_id, note from child") == [{"parent_id": 2, "note": "x"}]
        # an exec is a transaction of its own: nothing was inserted before it in it
        await db.exec("insert into child (parent_id, note) values (last_insert_rowid(), 'y')")
        assert await db.scalar("select parent_id from child where note = 'y'") == 0


@pytest.mark.parametrize("mode", MODES)
async def test_a_deferred_constraint_made_in_a_group_keeps_the_writes_after_it_out_of_its_commit(
    mode: str, tmp_path: Path
) -> None:
    """The check for deferred constraints was made at the batch's start only: the writes after a CREATE TABLE of
    the batch shared its commit, and an orphan insert passed because another write added the parent."""
    async with open_store(mode, tmp_path / "s") as store:
        for i in range(5):
            db = await store.database(f"app{i}")
            await db.exec("create table p (id integer primary key)")
            made, orphan, parent = await asyncio.gather(
                db.exec("create table c (pid integer references p (id) deferrable initially deferred)"),
                db.exec("insert into c (pid) values (7)"),
                db.exec("insert into p (id) values (7)"),
                return_exceptions=True,
            )
            assert isinstance(made, tinystore.Done), made
            if isinstance(orphan, tinystore.Done):  # the insert came first (no table yet): it had its own error
                pytest.fail(f"the orphan insert was accepted: {orphan}")
            assert isinstance(orphan, tinystore.TinystoreError)
            assert isinstance(parent, tinystore.Done)


@pytest.mark.parametrize("mode", MODES)
async def test_a_quote_in_a_quoted_name_does_not_hide_a_deferred_constraint(mode: str, tmp_path: Path) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database(
            "app",
            migrations=[
                (
                    "001.sql",
                    "create table p (id integer primary key);"
                    'create table c ("o\'clock" integer references p (id) deferrable initially deferred,'
                    " note text default 'n');",
                )
            ],
        )
        for i in range(5):
            orphan, parent = await asyncio.gather(
                db.exec('insert into c ("o\'clock") values (?)', 10 + i),
                db.exec("insert into p (id) values (?)", 10 + i),
                return_exceptions=True,
            )
            assert isinstance(orphan, tinystore.ConflictError), orphan
            assert isinstance(parent, tinystore.Done)


@pytest.mark.parametrize("mode", MODES)
async def test_a_write_that_failed_on_a_constraint_gets_the_outcome_of_the_committed_run(
    mode: str, tmp_path: Path
) -> None:
    """The failed write kept its error from the optimistic run; with a statement before it that is not
    deterministic, the committed re-run could be one where it succeeds: a UNIQUE error for a value nobody kept."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table u (x integer unique)")
        wrong = failed = 0
        for _ in range(120):
            await db.exec("delete from u")
            _, b = await asyncio.gather(
                db.exec("insert into u (x) values (abs(random()) % 2)"),
                db.exec("insert into u (x) values (0)"),
                return_exceptions=True,
            )
            rows = [r["x"] for r in await db.all("select x from u")]
            if isinstance(b, BaseException):
                failed += 1
                wrong += 0 not in rows
            else:
                assert rows.count(0) == 1
        assert failed > 0 and wrong == 0, f"{wrong} of {failed} failed inserts had no conflicting row kept"


@pytest.mark.parametrize("mode", MODES)
async def test_named_placeholders_of_dollars_only_are_refused(mode: str, tmp_path: Path) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (a, b)")
        for sql in ("select @$ as v", "select :$ as v", "select $$ as v", "select #$$ as v"):
            with pytest.raises(tinystore.InvalidError, match="named placeholder") as info:
                await db.one(sql, 5)
            assert sql.split()[1] in str(info.value)
        with pytest.raises(tinystore.InvalidError, match="named placeholder @\\$"):
            await db.exec("insert into t (a, b) values (@$, ?)", 1, 2)
        assert await db.scalar("select count(*) from t") == 0
        assert await db.scalar("select 'a$b' || ?", "c") == "a$bc"  # a $ inside a name or a string is no sigil


@pytest.mark.parametrize("mode", MODES)
async def test_pragmas_of_the_shared_connection_are_refused_under_their_old_names_too(
    mode: str, tmp_path: Path
) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        for pragma in ("default_cache_size = 5", "fullfsync = on", "checkpoint_fullfsync = on"):
            with pytest.raises(tinystore.InvalidError, match=pragma.split()[0]):
                await db.exec(f"pragma {pragma}")
        assert await db.scalar("pragma cache_size") == -2000


@pytest.mark.parametrize("mode", MODES)
async def test_a_transaction_that_deferred_foreign_keys_leaves_no_statement_without_its_restrict(
    mode: str, tmp_path: Path
) -> None:
    """SQLite (3.40) prepares a statement without its ON DELETE RESTRICT while ``defer_foreign_keys`` is on, and
    the writer's statement cache handed that statement to the next client after the transaction."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database(
            "app",
            migrations=[
                (
                    "001.sql",
                    "create table p (id integer primary key);"
                    "create table c (pid integer references p (id) on delete restrict deferrable initially deferred);"
                    "insert into p (id) values (1), (2), (3); insert into c (pid) values (1), (2), (3);",
                )
            ],
        )

        async def deferring(tx: tinystore.SqlTx) -> None:
            await tx.exec("pragma defer_foreign_keys = on")
            await tx.exec("delete from p where id = ?", 1)
            raise RuntimeError("roll back")

        async def delete_in_use(tx: tinystore.SqlTx) -> None:
            await tx.exec("delete from p where id = ?", 3)

        with pytest.raises(tinystore.ConflictError):
            await db.tx(delete_in_use)  # refused at the delete (RESTRICT acts at once, deferred or not)
        with pytest.raises(RuntimeError):
            await db.tx(deferring)
        calls = []

        async def delete_and_see(tx: tinystore.SqlTx) -> None:
            try:
                await tx.exec("delete from p where id = ?", 3)
            except tinystore.ConflictError as exc:
                calls.append(exc)

        await db.tx(delete_and_see)
        assert len(calls) == 1, "the delete of a parent in use was accepted after another client's deferring tx"
        assert await db.scalar("select count(*) from p") == 3


@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_or_fail_statement_leaves_nothing_in_exec_and_in_a_transaction(
    mode: str, tmp_path: Path
) -> None:
    """docs/sql.md: each statement runs in a savepoint of its own, so ``OR FAIL`` and ``RAISE(FAIL)`` leave
    nothing, as ``ABORT`` does; plain SQLite keeps the rows such a statement added before it failed."""
    plain = sqlite3.connect(":memory:", isolation_level=None)
    plain.execute("create table t (x unique)")
    plain.execute("insert into t values (2)")
    with pytest.raises(sqlite3.IntegrityError):
        plain.execute("insert or fail into t values (1), (2), (3)")
    assert [x for (x,) in plain.execute("select x from t order by x")] == [1, 2]  # SQLite keeps the 1
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (x unique)")
        await db.exec("insert into t values (2)")
        with pytest.raises(tinystore.ConflictError):
            await db.exec("insert or fail into t values (1), (2), (3)")

        async def fill(tx: tinystore.SqlTx) -> None:
            with pytest.raises(tinystore.ConflictError):
                await tx.exec("insert or fail into t values (4), (2), (5)")
            await tx.exec("insert into t values (6)")

        await db.tx(fill)
        assert [r["x"] for r in await db.all("select x from t order by x")] == [2, 6]


@pytest.mark.parametrize("mode", MODES)
async def test_last_insert_rowid_outside_an_insert_is_never_another_clients(mode: str, tmp_path: Path) -> None:
    """Trial AD2: outside an insert's own text the function gave the shared writer's value (another client's
    rowid) in an exec and in a transaction before its first insert, and 0 after a failed insert in a transaction
    (SQLite keeps the earlier one)."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table p (id integer primary key, k integer unique, note)")
        for i in range(5):
            await db.exec("insert into p (k) values (?)", 100 + i)  # rowids 1..5, as another client's
        assert (await db.exec("select last_insert_rowid() as r")).rows == [[0]]
        await db.exec("update p set note = last_insert_rowid() where k = 100")
        assert await db.scalar("select note from p where k = 100") == 0

        async def before_and_after(tx: tinystore.SqlTx) -> tuple[Any, int, Any]:
            before = await tx.scalar("select last_insert_rowid()")
            ok = await tx.exec("insert into p (k) values (200)")
            with pytest.raises(tinystore.ConflictError):
                await tx.exec("insert into p (k) values (200)")
            return before, ok.last_insert_rowid, await tx.scalar("select last_insert_rowid()")

        assert await db.tx(before_and_after) == (0, 6, 6)


@pytest.mark.parametrize("mode", MODES)
async def test_a_deferring_transaction_costs_other_clients_no_new_connection(mode: str, tmp_path: Path) -> None:
    """Trial AD2: the writer's connection was replaced after each transaction that deferred foreign keys (some
    0.5 ms each, other clients' writes halved); its statements are now prepared apart instead."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (x)")

        async def deferring(tx: tinystore.SqlTx) -> None:
            await tx.exec("pragma defer_foreign_keys = on")
            await tx.exec("insert into t values (1)")

        for _ in range(20):
            await db.tx(deferring)
        stats = (await store.status())["databases"]["app"]
        assert stats.get("connections_recycled", 0) == 0
        assert await db.scalar("select count(*) from t") == 20
