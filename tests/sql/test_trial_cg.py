"""From the known-left list of trial CF's fixes, and trials CG-CJ (session of 2026-12-03, third)."""

from __future__ import annotations

import pytest

import tinystore


# contract: SQL-06
@pytest.mark.parametrize(
    "sql",
    [
        "pragma/**/wal_checkpoint(truncate)",
        'pragma "wal_checkpoint"',
        "pragma main./* c */wal_checkpoint(passive)",
        "pragma [main].[wal_checkpoint]",
        "PRAGMA -- why\n `wal_checkpoint`(restart)",
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
