"""Durable commits: with durability "full" the writer syncs the WAL in each commit (SQLite's synchronous =
FULL), with "os" it hands commits to the OS; a client cannot change the pragmas durability stands on."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tinystore import InvalidError

FULL, NORMAL = 2, 1  # SQLite's values of PRAGMA synchronous


async def _writer_synchronous(db: tinystore.Database) -> int:
    """The writer connection's setting, read inside a transaction (which runs on the writer)."""

    async def read(tx: tinystore.SqlTx) -> int:
        return int(await tx.scalar("pragma synchronous"))

    return await db.tx(read)


# contract: SQL-02
@pytest.mark.parametrize(("durability", "expected"), [("full", FULL), ("os", NORMAL)])
async def test_the_writer_syncs_each_commit_with_durability_full(
    tmp_path: Path, durability: str, expected: int
) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False, durability=durability)
    try:
        db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
        await db.exec("insert into t values (1)")
        assert await _writer_synchronous(db) == expected
        assert await db.scalar("pragma journal_mode") == "wal"
    finally:
        await store.close()


# contract: SQL-02
@pytest.mark.parametrize(
    "pragma",
    [
        "synchronous = off",
        "synchronous = 0",
        "journal_mode = delete",
        "journal_mode = memory",
        "locking_mode = exclusive",
    ],
)
async def test_the_pragmas_durability_stands_on_cannot_be_set(store: tinystore.Store, pragma: str) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
    with pytest.raises(InvalidError) as info:
        await db.exec(f"pragma {pragma}")
    assert f"PRAGMA {pragma.split()[0]} is refused" in info.value.message

    async def in_tx(tx: tinystore.SqlTx) -> None:
        with pytest.raises(InvalidError):
            await tx.exec(f"pragma {pragma}")

    await db.tx(in_tx)
    await db.exec("insert into t values (1)")  # the session goes on
    assert await db.scalar("pragma journal_mode") == "wal"
    assert await _writer_synchronous(db) == FULL
    assert await db.scalar("select count(*) from t") == 1
