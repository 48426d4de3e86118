"""A call of ``store.database`` that brings new migrations to an open database, cancelled at any point: the
migrations go on in the server, each to its commit or rollback, and never hold the database's writer (trial GQ: a
migration's transaction, cancelled as it took the writer, stayed open for good, every write of the database
waiting behind it)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

import tinystore

BASE = ("001_base.sql", "create table t (a)")


# contract: SQL-03
# contract: SQL-05
async def test_a_cancelled_migration_of_an_open_database_never_holds_its_writer(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[BASE])
    migrations = [BASE]
    for k in range(30):
        migrations = [*migrations, (f"{100 + k:03d}.sql", f"create table m{k} (a); insert into m{k} values (1);")]
        call = asyncio.ensure_future(store.database("app", migrations=migrations))
        for _ in range(k % 15):  # (cancelled after 0 to 14 turns of the loop)
            await asyncio.sleep(0)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await asyncio.wait_for(db.exec("insert into t values (?)", k), 10)
    await store.database("app", migrations=migrations)  # what a cancel left undone is applied now, once
    for k in range(30):
        assert await db.scalar(f"select count(*) from m{k}") == 1
    assert await db.scalar("select count(*) from t") == 30
    for _ in range(300):  # (none left open: the last commit's bookkeeping may take a turn or two)
        n = (await store.status())["databases"]["app"]["open_transactions"]
        if n == 0:
            break
        await asyncio.sleep(0.01)
    assert n == 0


# contract: SQL-05
async def test_migrations_ended_by_the_stores_close_raise_closed_error_not_a_cancel(tmp_path: Path) -> None:
    # trial GR: the close cancelled the task the migrations ran in, and their caller, never cancelled, got a bare
    # CancelledError, which a TaskGroup took for its own and swallowed
    store = await tinystore.open(tmp_path / "s", embedded=True)
    await store.database("app", migrations=[BASE])
    slow = (  # (some seconds of writes)
        "with recursive n(i) as (select 1 union all select i + 1 from n where i < 3000000) "
        "insert into t select i from n"
    )
    call = asyncio.ensure_future(store.database("app", migrations=[BASE, ("002_slow.sql", slow)]))
    await asyncio.sleep(0.3)
    await store.close()
    with pytest.raises(tinystore.ClosedError):
        await call
