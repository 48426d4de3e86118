"""A read whose caller goes away (cancelled, timed out) stops on its thread instead of running to its end: the
reader is free again at once, and a transaction that gave up on a slow read goes on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store

SLOW = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 2000000000) select count(*) from c"
LIMITS = tinystore.Limits(readers=1, inline_read=0, statement_timeout=60.0)


@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
async def test_a_cancelled_read_frees_its_reader(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", limits=LIMITS) as store:
        db = await store.database("app")
        assert await db.scalar("select 1") == 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(db.scalar(SLOW), 0.3)
        # one reader thread: were the slow read still running, this would wait for it (up to a minute)
        started = time.monotonic()
        assert await asyncio.wait_for(db.scalar("select 2"), 10) == 2
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_transaction_goes_on_after_giving_up_on_a_read(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", limits=LIMITS) as store:
        db = await store.database("app", migrations=[("1.sql", "create table t (a);")])

        async def body(tx: tinystore.SqlTx) -> int:
            await tx.exec("insert into t values (1)")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(tx.scalar(SLOW), 0.3)
            await tx.exec("insert into t values (2)")  # the slow read was stopped; the transaction is whole
            return int(await tx.scalar("select count(*) from t"))

        started = time.monotonic()
        assert await db.tx(body) == 2
        assert time.monotonic() - started < 10
        assert await db.scalar("select count(*) from t") == 2
