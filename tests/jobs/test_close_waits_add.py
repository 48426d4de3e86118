"""Trial HY: an embedded store's close did not wait for a big ``add_many`` under way (its own transaction was rolled
back at the stop: ``ClosedError``), where a private or sidecar store's close waits for the writes it sent and the
jobs are added. An embedded store's close now waits for the writes under way in this process the same way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tinystore
from tinystore.engines.jobs import TABLE

from .util import wait_until


# contract: STORE-05
async def test_an_embedded_close_waits_for_a_big_add_many_under_way(tmp_path: Path) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    db = await store.database("app")
    q = store.queue("q", dict, database=db)
    await q.add({"warm": 1})
    values = [{"i": i} for i in range(20_000)]
    adding = asyncio.ensure_future(q.add_many(values))
    assert store._core is not None
    app = store._core.sql.databases["app"]
    await wait_until(lambda: app.active_tx is not None, what="the add's transaction")  # (its rows being inserted)
    await store.close()
    ids = await adding
    assert len(ids) == 20_000
    again = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        db2 = await again.database("app")
        assert await db2.scalar(f"select count(*) from {TABLE}") == 20_001
    finally:
        await again.close()
