"""Trial IB: a store closed while one of its transactions was open (its fn between two statements) and a write
was queued behind it: the close waited for that write, which waited for the transaction's writer until ``tx_idle``
(5 s; the close's whole bound of 10 s with a longer ``tx_idle``), in an embedded and a sidecar store. A close now
rolls back the transactions still open (they could no longer commit) before it waits for the writes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store


# contract: SQL-01
# contract: STORE-05
@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
@pytest.mark.parametrize("behind", ["exec", "add"])
async def test_a_close_rolls_back_an_open_transaction_before_waiting_for_the_writes_behind_it(
    tmp_path: Path, mode: str, behind: str
) -> None:
    limits = tinystore.Limits(tx_idle=60)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (k text)")])
        q = store.queue("q", dict, database=db)
        await q.add({"warm": 1})
        paused = asyncio.Event()

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values ('tx-1')")
            paused.set()
            await asyncio.sleep(3)  # (between two statements, the writer held)
            await tx.exec("insert into t values ('tx-2')")

        in_tx = asyncio.ensure_future(db.tx(fn))
        await paused.wait()
        write = asyncio.ensure_future(
            db.exec("insert into t values ('behind')") if behind == "exec" else q.add({"k": "behind"})
        )
        await asyncio.sleep(0.1)
        began = time.monotonic()
        await store.close()
        took = time.monotonic() - began
        with pytest.raises(tinystore.ClosedError, match="was rolled back"):
            await in_tx
        outcome = await asyncio.gather(write, return_exceptions=True)
        assert took < 2.5, (took, outcome)
    again = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        db = await again.database("app")
        rows = [r["k"] for r in await db.all("select k from t")]
        assert "tx-1" not in rows and "tx-2" not in rows
        done = outcome[0]
        if not isinstance(done, BaseException):  # (a write answered is kept)
            assert behind != "exec" or rows == ["behind"]
    finally:
        await again.close()


# contract: STORE-05
@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
async def test_a_close_rolls_back_a_transaction_begun_behind_the_one_it_rolled_back(tmp_path: Path, mode: str) -> None:
    """Trial ID: a second transaction waiting for the writer the first held was given it once the first was rolled
    back, after the close had rolled back what was open: it held the writer, and the write behind it waited for the
    close's whole bound (10 s)."""
    async with open_store(mode, tmp_path / "s", limits=tinystore.Limits(tx_idle=60)) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (k text)")])

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values ('tx')")
            await asyncio.sleep(3)
            await tx.exec("insert into t values ('tx')")

        txs = []
        for _ in range(2):
            txs.append(asyncio.ensure_future(db.tx(fn)))
            await asyncio.sleep(0.05)
        write = asyncio.ensure_future(db.exec("insert into t values ('behind')"))
        await asyncio.sleep(0.1)
        began = time.monotonic()
        await store.close()
        took = time.monotonic() - began
        outcomes = await asyncio.gather(*txs, write, return_exceptions=True)
        assert took < 2.5, (took, outcomes)
        assert all(isinstance(o, tinystore.ClosedError) for o in outcomes[:2]), outcomes


# contract: JOB-01
# contract: STORE-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_job_handler_may_begin_a_transaction_during_the_closes_grace(tmp_path: Path, mode: str) -> None:
    """Trial ID: a handler that began a db.tx during the close's grace was refused at once (rolled back as if it
    had been open when the close came), and the failure counted as an attempt."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (k text)")])
        q = store.queue("q", dict, database=db)
        jid = await q.add({"n": 1})
        started = asyncio.Event()

        async def handler(value: dict[str, int], run: tinystore.Run) -> None:
            started.set()
            await asyncio.sleep(0.5)  # (the close has begun)
            await db.tx(lambda tx: tx.exec("insert into t values ('done')"))

        q.work(handler)
        await asyncio.wait_for(started.wait(), 10)
        await store.close(grace="10s")
    again = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        db2 = await again.database("app")
        assert await db2.scalar("select count(*) from t") == 1
        job = await again.queue("q", dict, database=db2).get(jid)
        assert job is not None and job.state == "succeeded", job
    finally:
        await again.close()


LONG = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 1000000000) select count(*) from c"
"""A statement of minutes (a billion rows counted), cut short only by an interrupt."""


# contract: SQL-02
# contract: STORE-05
@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
@pytest.mark.parametrize("running", ["read", "tx read", "tx write"])
async def test_a_close_interrupts_a_long_read_and_a_rolled_back_transactions_statement(
    tmp_path: Path, mode: str, running: str
) -> None:
    """Trial IE: an embedded store's close waited 10 s for a read under way (a sidecar's ended it at once), and
    15 s for a long statement of a transaction the close had rolled back already (5 s in a private or sidecar
    store): nothing of either could be of use. A read under way is ended (``ClosedError``), and a rolled-back
    transaction's statement interrupted."""
    limits = tinystore.Limits(statement_timeout=120, tx_max=120)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (k)")])
        began_tx = asyncio.Event()

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values ('tx')")
            began_tx.set()
            if running == "tx read":
                await tx.scalar(LONG)
            else:
                await tx.exec(f"insert into t (k) {LONG}")

        call = asyncio.ensure_future(db.scalar(LONG) if running == "read" else db.tx(fn))
        if running != "read":
            await began_tx.wait()
        await asyncio.sleep(0.5)  # (its statement runs)
        began = time.monotonic()
        await store.close()
        took = time.monotonic() - began
        outcome = await asyncio.gather(call, return_exceptions=True)
        assert took < 4, (took, outcome)
        assert isinstance(outcome[0], (tinystore.ClosedError, tinystore.UnavailableError)), outcome
    again = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        assert await (await again.database("app")).scalar("select count(*) from t") == 0
    finally:
        await again.close()


# contract: STORE-05
async def test_an_embedded_close_keeps_to_its_bound_with_a_long_write_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial IE: an embedded store's close with a long write under way took 20 s, twice its bound: 10 s for the
    writes under way, then the engines' own stop gave the write a grace of 10 s more."""
    from tinystore.client import store as store_module

    monkeypatch.setattr(store_module, "CLOSE_WRITES_WAIT", 1.0)  # (10 s)
    store = await tinystore.open(tmp_path / "s", embedded=True, limits=tinystore.Limits(statement_timeout=120))
    db = await store.database("app", migrations=[("001.sql", "create table t (k)")])
    write = asyncio.ensure_future(db.exec(f"insert into t (k) {LONG}"))
    await asyncio.sleep(0.3)
    began = time.monotonic()
    await store.close()
    took = time.monotonic() - began
    outcome = await asyncio.gather(write, return_exceptions=True)
    assert took < 4, (took, outcome)
    assert isinstance(outcome[0], tinystore.ClosedError), outcome


# contract: STORE-05
async def test_an_embedded_close_ends_a_read_at_once_while_it_waits_for_a_long_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial IK: alone, a read under way ended at once as its embedded store closed; beside a long write, it ran
    on for the close's whole wait for the writes (10 s) and only then ended. Reads end first now."""
    from tinystore.client import store as store_module

    monkeypatch.setattr(store_module, "CLOSE_WRITES_WAIT", 3.0)  # (10 s)
    store = await tinystore.open(tmp_path / "s", embedded=True, limits=tinystore.Limits(statement_timeout=120))
    db = await store.database("app", migrations=[("001.sql", "create table t (k)")])
    ended: list[float] = []
    read = asyncio.ensure_future(db.scalar(LONG))
    read.add_done_callback(lambda _: ended.append(time.monotonic()))
    write = asyncio.ensure_future(db.exec(f"insert into t (k) {LONG}"))
    await asyncio.sleep(0.3)
    began = time.monotonic()
    await store.close()
    outcome = await asyncio.gather(read, write, return_exceptions=True)
    assert isinstance(outcome[0], tinystore.ClosedError), outcome
    assert ended[0] - began < 1.5, (ended[0] - began, outcome)
