"""Trial GT: a call that a store's close ends, in the program that closes it, raises ClosedError (never the
"try again later" UnavailableError a server's stop gives a client that has a next server to go to)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_transaction_waiting_for_the_writer_at_close_raises_closed_error(tmp_path: Path, mode: str) -> None:
    # embedded, 11 runs of 14 raised UnavailableError("...the store is stopping: the transaction was not begun")
    for attempt in range(4):
        async with open_store(mode, tmp_path / f"s{attempt}") as store:
            db = await store.database("app", migrations=[("001.sql", "create table t (v)")])
            holding = asyncio.Event()

            async def first(tx: tinystore.SqlTx, holding: asyncio.Event = holding) -> None:
                await tx.exec("insert into t values (1)")
                holding.set()
                await asyncio.sleep(0.3)

            async def second(tx: tinystore.SqlTx) -> None:
                await tx.exec("insert into t values (2)")

            one = asyncio.ensure_future(db.tx(first))
            await holding.wait()
            two = asyncio.ensure_future(db.tx(second))  # waits for the writer
            await asyncio.sleep(0.05 + 0.02 * attempt)
            await store.close()
            for task in (one, two):
                with pytest.raises(tinystore.ClosedError):
                    await task
