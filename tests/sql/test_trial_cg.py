"""From the known-left list of trial CF's fixes, and trials CG-CJ (session of 2026-12-03, third)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store


# contract: SQL-06
@pytest.mark.parametrize(
    "sql",
    [
        "pragma/**/wal_checkpoint(truncate)",
        'pragma "wal_checkpoint"',
        "pragma main./* c */wal_checkpoint(passive)",
        "pragma [main].[wal_checkpoint]",
        "PRAGMA -- why\n `wal_checkpoint`(restart)",
        "pragma 'wal_checkpoint'(truncate)",
        'pragma "main".wal_checkpoint',
    ],
)
async def test_a_checkpoint_spelled_any_way_runs_alone_through_exec(store: tinystore.Store, sql: str) -> None:
    """Only ``pragma wal_checkpoint`` with blanks was known for one: with a comment or quotes it ran inside the
    writer's transaction, and SQLite refused it there ("database table is locked")."""
    db = await store.database("app", migrations=[("1.sql", "create table t (x);")])
    await db.exec("insert into t values (1)")
    done = await db.exec(sql)
    assert done.columns == ["busy", "log", "checkpointed"] and done.rows[0][0] == 0, done
    assert await db.scalar("select count(*) from t") == 1


# contract: SQL-06
async def test_a_vacuum_has_no_statement_time_limit(tmp_path: Path) -> None:
    """VACUUM rewrites the whole file, so it takes as long as the database is large: one of a few GB passed
    ``statement_timeout`` (30 s), rolled back, and nothing but ``serve``'s hidden ``--limits`` could raise it. It
    runs under no time limit, as a migration does (it is asked for, like one); other statements keep theirs."""
    limits = tinystore.Limits(statement_timeout=0.05)
    fill = (
        "create table big as with recursive c(v) as (select 1 union all select v + 1 from c where v < 300000) "
        "select v, randomblob(32) as b from c;\ncreate index big_b on big (b);\ndelete from big where v % 2 = 0;"
    )
    async with open_store("private", tmp_path / "s", limits=limits) as store:
        db = await store.database("app", migrations=[("001_big.sql", fill)])
        await db.exec("vacuum")
        assert await db.scalar("select count(*) from big") == 150000
        with pytest.raises(tinystore.TimeoutError_):
            await db.exec("create table big2 as select * from big order by b")


# contract: SQL-06
async def test_a_checkpoint_in_a_transaction_is_refused_saying_where_it_runs(store: tinystore.Store) -> None:
    """In db.tx a checkpoint failed with SQLite's "database table is locked" (trial CH); it is refused, saying
    it runs through db.exec, and the transaction goes on."""
    db = await store.database("app", migrations=[("1.sql", "create table t (x);")])

    async def fn(tx: tinystore.SqlTx) -> int:
        await tx.exec("insert into t values (1)")
        with pytest.raises(
            tinystore.InvalidError, match=r"wal_checkpoint writes: it runs alone on the writer \(db\.exec"
        ):
            await tx.exec("pragma wal_checkpoint(truncate)")
        return int(await tx.scalar("select count(*) from t"))

    assert await db.tx(fn) == 1
    assert await db.scalar("select count(*) from t") == 1
