"""Trial EI: under steady writes and reads that overlap without a pause, a database's WAL grew without end (5 MB/s,
past the database's own size) and kept its size until the store stopped: SQLite's automatic checkpoint cannot reset
a WAL while some read holds a snapshot in it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import tinystore
from tinystore.engines import sql as sql_engine


# contract: SQL-02
async def test_the_wal_stays_bounded_under_overlapping_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql_engine, "WAL_BOUND", 1024 * 1024, raising=False)
    monkeypatch.setattr(sql_engine, "WAL_LOOK_EVERY", 0.05, raising=False)
    store = await tinystore.open(tmp_path / "store", embedded=True)
    try:
        db = await store.database("w", migrations=[("001.sql", "create table t (id integer primary key, v text)")])
        wal = tmp_path / "store" / "sql" / "w.db-wal"
        stop = asyncio.Event()
        written = 0

        async def writer() -> None:
            nonlocal written
            while not stop.is_set():
                await db.exec("insert into t (v) values (?)", "x" * 2000)
                written += 1

        async def reader() -> None:
            while not stop.is_set():
                await db.scalar("select count(*) from t where v like '%y%'")

        tasks = [asyncio.ensure_future(writer()) for _ in range(4)] + [
            asyncio.ensure_future(reader()) for _ in range(2)
        ]
        sizes = []
        try:
            # some 2 KB a write: 12 MB, what the WAL would hold without a checkpoint that resets it (15 s at most)
            for _ in range(150):
                await asyncio.sleep(0.1)
                sizes.append(os.path.getsize(wal))
                if written > 6000:
                    break
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        assert max(sizes[5:]) < 6 * 1024 * 1024, sizes
        assert await db.scalar("select count(*) from t") == written
    finally:
        await store.close()
