"""Trial GU: what the server keeps for a database name is let go once nothing opens it: each name whose open
failed (a first migration that does not run, its file removed) kept a lock in the engine for the server's life."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore


async def test_names_whose_open_failed_leave_nothing_behind(tmp_path: Path) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        engine = store._core.sql  # type: ignore[attr-defined]
        for i in range(40):
            with pytest.raises(tinystore.InvalidError):
                await store.database(f"n{i}", migrations=[("001.sql", "create tablx oops")])
        assert len(engine._opening) == 0
        assert not list((tmp_path / "s" / "sql").glob("n*.db"))
        # opens of one name at once still take their turns: one makes it, the others find it made
        dbs = await asyncio.gather(
            *(store.database("app", migrations=[("001.sql", "create table t (v)")]) for _ in range(5))
        )
        await dbs[0].exec("insert into t values (1)")
        assert await dbs[4].scalar("select count(*) from t") == 1
        assert len(engine._opening) == 0
        # a cancelled open lets go too, once its start has ended
        opening = asyncio.ensure_future(store.database("other", migrations=[("001.sql", "create table u (v)")]))
        await asyncio.sleep(0)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        db = await store.database("other", migrations=[("001.sql", "create table u (v)")])
        assert await db.scalar("select count(*) from u") == 0
        for _ in range(100):
            if not engine._opening:
                break
            await asyncio.sleep(0.01)
        assert len(engine._opening) == 0
    finally:
        await store.close()
