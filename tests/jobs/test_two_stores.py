"""A queue and a transaction of two different stores never mix: a transaction id means nothing to another store
(or names another client's transaction there), so ``tx.with_(queue)`` of another store's queue is refused at once,
nothing sent, and so is a queue of one store opened on another store's database."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError

from ..helpers import open_store

MIGRATIONS = [("001_t.sql", "create table t (a text);")]


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_transaction_of_one_store_cannot_add_to_a_queue_of_another(tmp_path: Path, mode: str) -> None:
    # contract: JOB-06
    async with open_store(mode, tmp_path / "a") as a, open_store(mode, tmp_path / "b") as b:
        db_a = await a.database("app", migrations=MIGRATIONS)
        db_b = await b.database("app", migrations=MIGRATIONS)
        q_b = b.queue("q", dict, database=db_b)
        await q_b.add({"warm": True})
        b_open, b_done = asyncio.Event(), asyncio.Event()

        async def b_tx(tx: Any) -> None:  # store B's own transaction, open meanwhile (ids count from 1 in each)
            await tx.exec("insert into t values ('B row')")
            b_open.set()
            await b_done.wait()

        b_task = asyncio.create_task(db_b.tx(b_tx))
        await b_open.wait()

        async def a_tx(tx: Any) -> str:
            await tx.exec("insert into t values ('A row')")
            added: str = await tx.with_(q_b).add({"from": "A's transaction"})
            return added

        with pytest.raises(InvalidError, match="queue q: the transaction belongs to another store"):
            await db_a.tx(a_tx)
        b_done.set()
        await b_task
        assert await db_a.scalar("select count(*) from t") == 0  # A rolled back
        assert await db_b.all("select a from t") == [{"a": "B row"}]
        jobs = await q_b.list()
        assert [j.value for j in jobs.jobs] == [{"warm": True}]  # nothing joined B's transaction


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_queue_cannot_live_in_another_stores_database(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "a") as a, open_store(mode, tmp_path / "b") as b:
        db_b = await b.database("app", migrations=MIGRATIONS)
        with pytest.raises(InvalidError, match="queue qx: option database: database app belongs to another store"):
            a.queue("qx", dict, database=db_b)
        assert isinstance(a.queue("qx", dict, database="app"), tinystore.Queue)  # by name: this store's own
