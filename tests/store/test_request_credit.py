"""A connection's request credit (1,024 requests in flight) is never all taken by calls that wait at the server
for something else to happen (a transaction's begin waiting for the writer, a job's watch): the calls that end
those waits still go out. Over a connection only: an embedded store has no credit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store

MANY = 1100  # past the credit


@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_more_transactions_than_the_credit_all_commit(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "store") as store:
        db = await store.database(
            "app",
            migrations=[
                ("001.sql", "create table c (id integer primary key, n integer); insert into c values (1, 0);")
            ],
        )

        async def bump(tx: tinystore.SqlTx) -> None:
            n = await tx.scalar("select n from c where id = 1")
            await tx.exec("update c set n = ? where id = 1", n + 1)

        # before, the begins took every slot: the transaction holding the writer could not send its next
        # statement, was rolled back at tx_idle, and the next did the same, for ever (no error, no commit)
        async with asyncio.timeout(90):
            await asyncio.gather(*(db.tx(bump) for _ in range(MANY)))
        assert await db.scalar("select n from c where id = 1") == MANY


async def test_more_watches_than_the_credit_leave_room_for_other_calls(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "store") as store:
        queue = store.queue("q", dict)
        job_id = await queue.add({"n": 1})
        seen = 0

        async def watch() -> None:
            nonlocal seen
            async for job in queue.watch(job_id):
                seen += 1
                if job.state == "succeeded":
                    return

        watches = [asyncio.ensure_future(watch()) for _ in range(MANY)]
        try:
            await asyncio.sleep(0.5)
            async with asyncio.timeout(10):  # before: these waited behind the watches for ever
                assert (await store.status())["version"]
                assert (await queue.get(job_id)).state == "queued"

                async def done(value: dict[str, int], run: tinystore.Run) -> None:
                    return None

                assert await queue.run_due(done) == 1
            async with asyncio.timeout(60):
                await asyncio.gather(*watches)
        finally:
            for w in watches:
                w.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
        assert seen >= MANY


@pytest.mark.parametrize("mode", ["private", "tcp"])
async def test_writes_waiting_for_a_transactions_writer_leave_room_for_its_statements(
    tmp_path: Path, mode: str
) -> None:
    """Plain writes wait at the server while a transaction holds the writer; 2,000 of them took all the credit,
    so the transaction's next statement could not go out and it was rolled back at tx_idle."""
    async with open_store(mode, tmp_path / "store") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (v integer);")])
        began = asyncio.Event()
        writes: list[asyncio.Future[object]] = []

        async def fn(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values (0)")
            began.set()
            await asyncio.sleep(0.5)  # meanwhile, 2,000 writes come and wait for the writer
            await tx.exec("insert into t values (-1)")

        async with asyncio.timeout(60):
            tx = asyncio.ensure_future(db.tx(fn))
            await began.wait()
            writes = [asyncio.ensure_future(db.exec("insert into t values (?)", i)) for i in range(1, 2001)]
            await tx
            await asyncio.gather(*writes)
        assert await db.scalar("select count(*) from t") == 2002
