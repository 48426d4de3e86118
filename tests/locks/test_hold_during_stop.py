"""A hold asked while the store stops gracefully is not run by it, and is asked again of the next server, as every
other call that the stop refuses (STORE-05; trial BR: it raised UnavailableError at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tinystore

from ..helpers import stop_sidecar

SLOW = (
    "insert into t (a) select x from (with recursive c(x) as (select 1 union all select x + 1 from c "
    "where x < 4000000) select x from c)"
)


# contract: LOCK-03
# contract: STORE-05
async def test_a_hold_asked_while_the_store_stops_is_asked_of_the_next_one(tmp_path: Path) -> None:
    d = tmp_path / "s"
    a = await tinystore.open(d, idle="5s")
    c = await tinystore.open(d)
    try:
        db = await a.database("app")
        await db.exec("create table t (id integer primary key, a int)")
        slow = asyncio.ensure_future(db.exec(SLOW))  # the stop waits for it
        await asyncio.sleep(0.3)
        stop = asyncio.ensure_future(a.stop_server(grace=8))
        await asyncio.sleep(0.5)
        assert not slow.done()  # the server is stopping, and refuses new calls as not run
        epoch = c.epoch
        async with c.lock("k", ttl="5s").hold("x", wait=20):
            assert c.epoch != epoch  # granted by the next server
        await asyncio.gather(slow, stop, return_exceptions=True)
    finally:
        await c.close()
        await a.close()
        await stop_sidecar(d)
