"""Reads see every write whose completion was seen before they were asked, whatever the batching of inline
reads in one loop turn (one read transaction per turn)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

import tinystore


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_reads_see_completed_writes(tmp_path: Path, mode: str) -> None:
    store = await tinystore.open(tmp_path, embedded=(mode == "embedded"))
    try:
        db = await store.database("x")
        await db.exec("create table t (id integer primary key, v integer)")
        q: asyncio.Queue[int] = asyncio.Queue()
        stop = False

        async def writer(k: int) -> None:
            for i in range(150):
                v = k * 1000 + i
                await db.exec("insert into t (v) values (?)", v)
                assert await db.one("select v from t where v = ?", v) == {"v": v}
                q.put_nowait(v)

        async def reader() -> None:
            while not stop:
                v = await q.get()
                await db.one("select v from t where id = ?", 1)
                assert await db.scalar("select count(*) from t where v = ?", v) == 1

        async def noise() -> None:
            while not stop:
                await db.one("select v from t where id = ?", random.randrange(1, 100))
                await asyncio.sleep(0)  # an embedded read does not yield

        readers = [asyncio.ensure_future(reader()) for _ in range(4)] + [
            asyncio.ensure_future(noise()) for _ in range(8)
        ]
        await asyncio.gather(*(writer(k) for k in range(16)))
        while not q.empty():
            await asyncio.sleep(0.01)
        stop = True
        for r in readers:
            r.cancel()
        res = await asyncio.gather(*readers, return_exceptions=True)
        assert all(isinstance(x, asyncio.CancelledError) for x in res), res
        assert await db.scalar("select count(*) from t") == 16 * 150
    finally:
        await store.close()
