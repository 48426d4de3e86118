"""From trial AL: ``PRAGMA wal_checkpoint`` through ``db.exec`` always failed as "database table is locked"
(InvalidError): it ran inside the group commit's transaction, where SQLite cannot checkpoint. It now runs alone
on the writer, outside any transaction, as VACUUM does."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store


# contract: SQL-06
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_checkpoint_through_exec_runs(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "store") as store:
        db = await store.database("app", migrations=[("1.sql", "create table t (x integer);")])
        for i in range(50):
            await db.exec("insert into t (x) values (?)", i)
        for sql in (
            "pragma wal_checkpoint",
            "PRAGMA main.wal_checkpoint(TRUNCATE)",
            "/* c */ pragma wal_checkpoint(passive)",
        ):
            await db.exec(sql)
        wal = tmp_path / "store" / "sql" / "app.db-wal"
        await db.exec("pragma wal_checkpoint(truncate)")
        assert wal.stat().st_size == 0
        assert await db.scalar("select count(*) from t") == 50
        with pytest.raises(tinystore.InvalidError):  # (inside a transaction, SQLite's own refusal stays)
            await db.tx(lambda tx: tx.exec("pragma wal_checkpoint"))
