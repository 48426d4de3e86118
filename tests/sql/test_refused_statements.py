"""Statements a client may not run: ATTACH/DETACH and VACUUM INTO (files outside the store), transaction control,
load_extension; each refusal says which and why. VACUUM itself runs (alone on the writer)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tinystore import InvalidError


# contract: STORE-04
async def test_attach_is_refused_and_writes_no_file(store: tinystore.Store, tmp_path: Path) -> None:
    db = await store.database("app")
    evil = tmp_path / "evil.db"
    with pytest.raises(InvalidError) as info:
        await db.exec(f"attach database '{evil}' as evil")
    assert "ATTACH" in info.value.message
    assert not evil.exists()
    with pytest.raises(InvalidError):
        await db.exec("detach database main")
    assert await db.scalar("select 1") == 1  # the session goes on


async def test_transaction_control_in_exec_is_refused(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
    for stmt in ("begin", "commit", "rollback", "savepoint s"):
        with pytest.raises(InvalidError) as info:
            await db.exec(stmt)
        assert "BEGIN, COMMIT, ROLLBACK, SAVEPOINT and RELEASE are run by the store" in info.value.message
    await db.exec("insert into t values (1)")
    assert await db.scalar("select count(*) from t") == 1


async def test_a_row_that_does_not_fit_the_type_is_an_invalid_error(store: tinystore.Store) -> None:
    import dataclasses

    @dataclasses.dataclass
    class Msg:
        id: int
        chat_id: int

    db = await store.database("app", migrations=[("1.sql", "create table m (id integer primary key, text);")])
    await db.exec("insert into m (text) values ('x')")
    with pytest.raises(InvalidError) as info:
        await db.one(Msg, "select id, text from m")
    assert "Msg" in info.value.message and "chat_id" in info.value.message


# contract: STORE-04
async def test_vacuum_runs_alone_and_vacuum_into_is_refused(store: tinystore.Store, tmp_path: Path) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
    await db.exec("insert into t select zeroblob(1000) from (select 1 union all select 2 union all select 3)")

    async def write_and_vacuum(n: int) -> None:
        await db.exec("insert into t values (?)", n)

    # a VACUUM among group-committed writes: it runs alone, the writes around it commit as ever
    await asyncio.gather(*(write_and_vacuum(n) for n in range(5)), db.exec("/* tidy */ VACUUM"), db.exec("vacuum;"))
    assert await db.scalar("select count(*) from t") == 8
    copy = tmp_path / "copy.db"
    with pytest.raises(InvalidError) as info:
        await db.exec(f"vacuum into '{copy}'")
    assert "VACUUM INTO" in info.value.message and not copy.exists()
    with pytest.raises(InvalidError) as info:
        await db.all("vacuum")  # a read: VACUUM writes
    assert "VACUUM writes" in info.value.message

    async def in_tx(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t values (9)")
        with pytest.raises(InvalidError, match="VACUUM"):
            await tx.exec("vacuum")

    await db.tx(in_tx)  # the transaction goes on after the refusal, and commits
    assert await db.scalar("select count(*) from t") == 9


async def test_load_extension_is_refused_by_name(store: tinystore.Store) -> None:
    db = await store.database("app")
    with pytest.raises(InvalidError) as info:
        await db.exec("select load_extension('/tmp/nothing.so')")
    assert "load_extension is refused" in info.value.message
    assert await db.scalar("select 1") == 1


# contract: STORE-04
async def test_connection_state_a_client_would_share_is_refused(store: tinystore.Store) -> None:
    """The clients of a database share its writer and readers: a pragma that changes a connection's behaviour,
    or a TEMP object, would reach every other client's statements. Each is refused by name; nothing changed."""
    db = await store.database(
        "app",
        migrations=[("1.sql", "create table acct (id integer primary key, balance integer check (balance >= 0));")],
    )
    for stmt in (
        "pragma ignore_check_constraints = 1",
        "pragma case_sensitive_like = 1",
        "pragma recursive_triggers = on",
        "pragma foreign_keys = off",
        "pragma writable_schema = on",
    ):
        name = stmt.split()[1]
        with pytest.raises(InvalidError) as info:
            await db.exec(stmt)
        assert f"PRAGMA {name}" in info.value.message and "shares" in info.value.message
        with pytest.raises(InvalidError):
            await db.one(stmt)  # through a read too (a reader is shared as well)
    for stmt in (
        "create temp table scratch (a)",
        "create temp view v as select 1",
        "create temp trigger tr after insert on acct begin select 1; end",
    ):
        with pytest.raises(InvalidError) as info:
            await db.exec(stmt)
        assert "TEMP" in info.value.message
    with pytest.raises(tinystore.ConflictError):
        await db.exec("insert into acct (id, balance) values (1, -5)")  # CHECK constraints still hold
    assert await db.scalar("select 'ABC' like 'abc'") == 1
    assert await db.scalar("pragma foreign_keys") == 1  # reading a pragma is fine
    await db.exec("pragma user_version = 7")  # so is setting what belongs to the database file
    assert await db.scalar("pragma user_version") == 7


# contract: SQL-04
async def test_last_insert_rowid_is_zero_when_no_rowid_row_was_added(store: tinystore.Store) -> None:
    """SQLite keeps the last rowid any insert on the connection gave, and the writer is shared: an upsert that
    took its DO UPDATE path, or an insert into a WITHOUT ROWID table, must give 0, not another client's row."""
    db = await store.database(
        "app",
        migrations=[
            (
                "1.sql",
                "create table t (id integer primary key, k text unique, v);\n"
                "create table w (k text primary key, v) without rowid;",
            )
        ],
    )
    await db.exec("insert into t (id, k, v) values (1, 'a', 1)")
    results = await asyncio.gather(
        db.exec("insert into t (id, k, v) values (4242, 'other', 1)"),
        db.exec("insert into t (k, v) values ('a', 2) on conflict (k) do update set v = excluded.v"),
        db.exec("insert into w (k, v) values ('x', 1)"),
        db.exec("insert into t (k, v) values ('b', 3)"),
    )
    assert [r.last_insert_rowid for r in results] == [4242, 0, 0, 4243], results
    assert [r.changes for r in results] == [1, 1, 1, 1]

    async def fn(tx: tinystore.SqlTx) -> tuple[int, int]:
        a = await tx.exec("insert into t (k, v) values ('c', 1)")
        b = await tx.exec("insert into w (k, v) values ('y', 1)")
        return a.last_insert_rowid, b.last_insert_rowid

    assert await db.tx(fn) == (4244, 0)
