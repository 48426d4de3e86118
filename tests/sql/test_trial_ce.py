"""From trial CE: a tester breaking the changes of trials CC and CF (migrations with foreign keys off, strict
typed rows, checkpoints)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Annotated, Optional

import msgspec
import pytest

import tinystore
from tests.helpers import open_store, sqlite_file
from tinystore import InvalidError

USERS = ("001.sql", "create table users (id integer primary key, email text not null);")


# contract: SQL-05
async def test_a_foreign_keys_pragma_with_no_semicolon_does_not_take_the_next_statement(store: tinystore.Store) -> None:
    """Passed over as a PRAGMA foreign_keys, the text took the statement after it (no ``;`` between): the
    migration was recorded as applied without its unique index."""
    text = "PRAGMA foreign_keys=off\ncreate unique index users_email on users(email);"
    with pytest.raises(InvalidError, match=r"migration 002\.sql"):
        await store.database("app", migrations=[USERS, ("002.sql", text)])
    db = await store.database("app", migrations=[USERS])
    assert await db.scalar("select count(*) from sqlite_master where name = 'users_email'") == 0
    spelled = "pragma /* off */ foreign_keys = off;\ncreate unique index users_email on users(email);\n-- end"
    await store.database("app", migrations=[USERS, ("002.sql", spelled)])
    assert await db.scalar("select count(*) from sqlite_master where name = 'users_email'") == 1


# contract: SQL-05
@pytest.mark.parametrize("open_first", [False, True])
async def test_a_foreign_key_mismatch_in_the_schema_blocks_no_migration(tmp_path: Path, open_first: bool) -> None:
    """``invites.email references users(email)``, with users.email no key: SQLite's foreign_key_check fails
    ("foreign key mismatch"), and so did every migration, even the one that makes the key."""
    sqlite_file(
        tmp_path / "s" / "sql" / "app.db",
        "create table users (id integer primary key, email text);"
        "create table invites (email text references users(email));"
        "insert into users values (1, 'a@x');",
    )
    async with open_store("embedded", tmp_path / "s") as store:
        if open_first:
            await store.database("app")
        db = await store.database(
            "app", migrations=[("002_fix.sql", "create unique index users_email on users(email);")]
        )
        await db.exec("insert into invites values ('a@x')")
        with pytest.raises(tinystore.ConflictError):
            await db.exec("insert into invites values ('nobody@x')")


# contract: SQL-05
async def test_many_orphans_from_before_do_not_fail_a_migration_of_an_open_database(tmp_path: Path) -> None:
    """Read whole through a transaction, the orphans from before went past sql_result_bytes: LimitError, and the
    migration was not even named."""
    sqlite_file(
        tmp_path / "s" / "sql" / "app.db",
        "create table users (id integer primary key);"
        "create table posts (user_id int references users(id));"
        "insert into posts select value from (with recursive c(value) as (select 1 union all select value + 1"
        " from c where value < 20000) select value from c);",
    )
    async with open_store("embedded", tmp_path / "s", limits=tinystore.Limits(sql_result_bytes=1 << 20)) as store:
        db = await store.database("app")
        await store.database("app", migrations=[("002.sql", "create table other (x);")])
        assert await db.scalar("select count(*) from posts") == 20000


# contract: SQL-06
async def test_a_checkpoint_through_exec_waits_a_second_at_most_for_readers(store: tinystore.Store) -> None:
    """A TRUNCATE checkpoint through exec (what the docs advise) waited for an open read-only transaction while
    holding every write (12 s in the trial, up to tx_max). It waits a second, then answers what it did."""
    db = await store.database("app", migrations=[("1.sql", "create table t (x);")])
    await db.exec("insert into t values (1)")
    opened = asyncio.Event()
    release = asyncio.Event()

    async def report(tx: tinystore.SqlTx) -> None:
        await tx.scalar("select count(*) from t")
        opened.set()
        await release.wait()

    reader = asyncio.ensure_future(db.tx(report, read_only=True))
    try:
        await opened.wait()
        await db.exec("insert into t values (2)")  # (a frame the reader's snapshot holds back)
        started = time.monotonic()
        checkpoint = asyncio.ensure_future(db.exec("pragma wal_checkpoint(truncate)"))
        await asyncio.sleep(0.1)
        await db.exec("insert into t values (3)")
        done = await checkpoint
        assert time.monotonic() - started < 5
        assert done.columns == ["busy", "log", "checkpointed"] and done.rows[0][0] == 1, done
    finally:
        release.set()
        await reader
    done = await db.exec("pragma wal_checkpoint(truncate)")
    assert done.rows == [[0, 0, 0]], done


@dataclasses.dataclass
class Flags:
    v: Annotated[bool, msgspec.Meta(description="on")]
    w: Optional[Annotated[bool, msgspec.Meta(description="maybe")]] = None  # noqa: UP045 (the spelling tried)
    n: int | bool | None = None


async def test_typed_rows_take_0_and_1_for_every_spelling_of_a_bool(store: tinystore.Store) -> None:
    db = await store.database("app")
    assert await db.one(Flags, "select 1 as v, 0 as w, 1 as n") == Flags(True, False, 1)
    assert await db.one(Optional[Flags], "select 0 as v") == Flags(False)  # noqa: UP045
    with pytest.raises(InvalidError, match="does not fit"):
        await db.one(Flags, "select 2 as v")
