"""From trial AI: a claim that waits behind a long transaction on the queue's database must not lose its lease
while it waits. The lease counts from when the claim takes effect (its commit), not from when it was asked for."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from .util import START, other_client, wait_state


@pytest.fixture(params=["embedded", "private"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store", clock=START) as s:
        yield s


# contract: JOB-01
# contract: JOB-03
async def test_a_claim_queued_behind_a_long_transaction_gets_a_whole_lease(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (x integer);")])
    async with other_client(store) as worker_side:  # over the socket: its attempts have leases
        wdb = await worker_side.database("app")
        q = store.queue("slow-db", database=db, lease="3s", attempts=1)
        wq = worker_side.queue("slow-db", database=wdb, lease="3s", attempts=1)
        jid = await q.add("v", delay="5s")
        ran: list[int] = []

        async def handler(value: Any, run: tinystore.Run) -> str:
            ran.append(run.attempt)
            await asyncio.sleep(0.3)  # long enough for a lease that ran out while queued to be noticed
            return "ok"

        worker = wq.work(handler, concurrency=1)
        try:
            await asyncio.sleep(0.3)  # the worker's claim is waiting for a due job

            async def long_tx(tx: tinystore.SqlTx) -> None:
                await tx.exec("insert into t (x) values (1)")
                await store.clock.advance("5s")  # the job is due: the claim's write queues behind this tx
                await asyncio.sleep(0.3)
                await store.clock.advance("10s")  # three leases pass while the claim waits for the writer
                await tx.exec("insert into t (x) values (2)")

            await db.tx(long_tx)
            job = await wait_state(q, jid, "succeeded", "dead")
            assert job.state == "succeeded", job.error
            assert job.attempts == 1 and ran == [1]
        finally:
            await worker.stop()
