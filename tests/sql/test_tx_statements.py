"""A client's BEGIN/COMMIT/ROLLBACK/SAVEPOINT/RELEASE is refused: it cannot end a group commit's transaction
nor leave a reader inside a transaction (stale reads)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tinystore.errors import InvalidError


async def test_tx_statements_are_refused(tmp_path: Path) -> None:
    async with await tinystore.open(tmp_path, embedded=True) as store:
        db = await store.database("x")
        await db.exec("create table t (a)")
        n = 0
        for sql in [
            "commit",
            "begin",
            "begin immediate",
            "rollback",
            "savepoint q",
            "release q",
            "end",
            "/* x */ COMMIT",
        ]:
            res = await asyncio.gather(
                db.exec("insert into t values (1)"),
                db.exec(sql),
                db.exec("insert into t values (2)"),
                return_exceptions=True,
            )
            assert isinstance(res[1], InvalidError) and "run by the store" in res[1].message, res
            n += 2
            assert await db.scalar("select count(*) from t") == n
            with pytest.raises(InvalidError, match="run by the store"):
                await db.all(sql)
            await db.exec("insert into t values (3)")
            n += 1
            assert await db.scalar("select count(*) from t") == n  # the inline reader is not stuck in a snapshot

            async def fn(tx, sql=sql):
                with pytest.raises(InvalidError, match="run by the store"):
                    await tx.exec(sql)
                await tx.exec("insert into t values (4)")

            await db.tx(fn)
            n += 1
            assert await db.scalar("select count(*) from t") == n
