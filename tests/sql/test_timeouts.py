"""Statement and transaction time limits: a clear TimeoutError_ naming the limit, and nothing else harmed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store

RUNAWAY_WRITE = (
    "insert into t (v) select x from (with recursive c(x) as (select 1 union all select x + 1 from c) select x from c)"
)
RUNAWAY_READ = "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c"


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_runaway_statements_stop_at_statement_timeout(tmp_path: Path, mode: str) -> None:
    limits = tinystore.Limits(statement_timeout=0.3)
    async with open_store(mode, tmp_path, limits=limits) as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, v)")
        # a runaway write queued with good ones (one group commit): it alone fails, the others commit
        results = await asyncio.gather(
            db.exec("insert into t (v) values ('before')"),
            db.exec(RUNAWAY_WRITE),
            db.exec("insert into t (v) values ('after')"),
            return_exceptions=True,
        )
        assert isinstance(results[1], tinystore.TimeoutError_), results[1]
        assert "statement_timeout (0.3s)" in str(results[1])  # the limit's value, as tx_idle's message gives it
        assert not isinstance(results[0], BaseException) and not isinstance(results[2], BaseException)
        assert await db.all("select v from t order by id") == [{"v": "before"}, {"v": "after"}]
        with pytest.raises(tinystore.TimeoutError_, match=r"statement_timeout \(0\.3s\), and was stopped"):
            await db.scalar(RUNAWAY_READ)

        async def runaway(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (v) values ('in tx')")
            await tx.exec(RUNAWAY_WRITE)

        with pytest.raises(tinystore.TimeoutError_, match="statement_timeout"):
            await db.tx(runaway)
        # the writer is free, the failed transaction left nothing
        await asyncio.wait_for(db.exec("insert into t (v) values ('last')"), 5)
        assert await db.scalar("select count(*) from t") == 3


async def test_the_engines_own_begin_and_commit_are_never_stopped(tmp_path: Path) -> None:
    """SQLite's progress handler fires now and then inside the engine's own cached BEGIN/COMMIT (it counts a
    prepared statement's steps across its runs). Those ran under the last statement's limit: after an idle
    writer (a limit long past) or a read whose caller was done, a write or a commit failed with TimeoutError_
    (and a COMMIT stopped so may have committed all the same). They run under no limit now; statements still do."""
    from tinystore.engines.sql import SqlEngine
    from tinystore.engines.sql_guard import ctl
    from tinystore.limits import Limits

    eng = SqlEngine(tmp_path, Limits(statement_timeout=0.001))
    db, _ = await eng.open("x", [("001", "create table t (id integer primary key, v);")])
    conn = db.connect(readonly=False)
    try:
        arm = db._progress_guard(conn)
        arm(0.0)  # a limit long past, as after a writer sat idle
        for _ in range(30_000):  # the handler fires in some of these (every 10,000 steps)
            ctl(conn, "begin immediate --ts")
            ctl(conn, "commit --ts")
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        arm(1e18, done)  # a read whose caller is done: its own statement stops, the engine's do not
        for _ in range(30_000):
            ctl(conn, "begin --ts")
            ctl(conn, "rollback --ts")
        with pytest.raises(Exception, match="interrupt"):
            conn.execute(RUNAWAY_READ).fetchall()
    finally:
        conn.close()
        await eng.close()
