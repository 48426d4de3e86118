"""A task started inside ``db.tx``'s ``fn`` (or a subscription's handler, or a worker) inherits the mark of the
transaction; it may not write to that database while ``fn`` runs (it would wait for the writer the transaction holds),
and may once ``fn`` has ended (trial AH: it never could again, even long after the commit)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store


# contract: SQL-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_task_started_in_a_transaction_writes_once_the_transaction_has_ended(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (v text)")])
        queue = store.queue("audit", database=db)
        may_go = asyncio.Event()
        refused: list[str] = []

        async def later() -> None:
            try:
                await db.exec("insert into t values ('early')")
            except tinystore.InvalidError as exc:
                refused.append(exc.message)
            await may_go.wait()
            await db.exec("insert into t values ('later')")
            await queue.add({"audit": 1})
            await db.tx(lambda tx: tx.exec("insert into t values ('its own tx')"))

        tasks: list[asyncio.Task[None]] = []

        async def save(tx: Any) -> None:
            await tx.exec("insert into t values ('row')")
            tasks.append(asyncio.create_task(later()))
            await asyncio.sleep(0.05)  # the task runs while the transaction is open: refused, it would wait

        await db.tx(save)
        may_go.set()
        await asyncio.wait_for(tasks[0], 10)
        assert refused and "would wait for itself" in refused[0]
        rows = [r["v"] for r in await db.all("select v from t order by rowid")]
        assert rows == ["row", "later", "its own tx"]
        assert (await queue.list()).jobs[0].value == {"audit": 1}


# contract: SQL-01
async def test_a_subscription_made_in_a_transaction_writes_from_its_handler(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (v text)")])
        events = store.channel("ev")
        wrote = asyncio.Event()
        errors: list[BaseException] = []

        async def handler(message: Any) -> None:
            try:
                await db.exec("insert into t values (?)", message.value["v"])
            except BaseException as exc:
                errors.append(exc)
            wrote.set()

        subs: list[Any] = []

        async def setup(tx: Any) -> None:
            subs.append(await events.subscribe(handler))

        await db.tx(setup)
        await events.publish({"v": "heard"})
        await asyncio.wait_for(wrote.wait(), 10)
        assert errors == []
        assert await db.scalar("select v from t") == "heard"
        await subs[0].stop()
