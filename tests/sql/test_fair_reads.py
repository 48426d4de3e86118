"""A database's reader threads take turns between clients: a client's read waits for the first reader to come
free, not behind every read another client sent before it (trial BB: with the defaults a one-row read waited 58 s
behind two clients' slow reads). Checked by the order reads end in, not by their times."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store

SLOW = "with recursive c(x) as (select 1 union all select x + 1 from c where x < ?) select count(*) from c"
SLOW_N = 1_500_000
SENT = 6


# contract: SQL-03
@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_clients_read_does_not_wait_behind_another_clients_line(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(readers=2)) as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, name text)")
        await db.exec("insert into t (name) values ('ann')")
        other = await tinystore.open(tmp_path / "s")  # another client: over the embedded store's socket, or the
        try:  # sidecar's (a connection of its own)
            assert other.transport is not store.transport
            mine = await other.database("app")
            ended: list[str] = []

            async def slow(i: int) -> None:
                assert await db.scalar(SLOW, SLOW_N) == SLOW_N
                ended.append(f"slow{i}")

            async def quick() -> None:
                assert await mine.scalar("select count(*) from t where name like 'a%'") == 1
                ended.append("quick")

            slows = [asyncio.ensure_future(slow(i)) for i in range(SENT)]
            await asyncio.sleep(0.05)  # the slow reads are all sent, two under way, the rest waiting
            await asyncio.gather(quick(), *slows)
            # first in first out, the quick read ended last; taking turns, it runs on the first reader that frees
            assert ended.index("quick") <= 3, ended
        finally:
            await other.close()
