"""An open of a database whose caller gives up while its migrations run: the migrations still run (SQLite cannot
be stopped halfway through a migration's transaction), and the next open of that database waits for them and
then finds them applied; it never applies them a second time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ..helpers import open_store

# a migration that takes SQLite a good fraction of a second
SLOW = [
    ("001_x.sql", "create table x (a);"),
    (
        "002_fill.sql",
        "insert into x with recursive c(v) as (select 1 union all select v + 1 from c limit 1500000) select v from c;",
    ),
]


@pytest.mark.parametrize("already_open", [False, True])
@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
async def test_an_open_cancelled_while_its_migrations_run_leaves_them_to_the_next_open(
    tmp_path: Path, mode: str, already_open: bool
) -> None:
    # contract: SQL-05
    async with open_store(mode, tmp_path / "s") as store:
        if already_open:  # the slow one is a new migration of an open database
            await store.database("app", migrations=SLOW[:1])
        first = asyncio.ensure_future(store.database("app", migrations=SLOW))
        await asyncio.sleep(0.1)  # the migrations are under way
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        db = await store.database("app", migrations=SLOW)  # applied now, or by the cancelled open: never twice
        assert await db.scalar("select count(*) from x") == 1_500_000
        assert await db.scalar("select count(*) from _tinystore_migrations") == 2
