"""The result-size limit (``Limits.sql_result_bytes``) holds for any number of rows, one row too."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store

EIGHT_ROWS = "(select 1 union all select 2 union all select 3 union all select 4 union all select 5 union all " + (
    "select 6 union all select 7 union all select 8)"
)


async def test_a_few_large_rows_are_over_the_default_limit(tmp_path: Path) -> None:
    """The user's case: 8 rows of 10 MB each (80 MB) are over the 64 MiB default, although fewer than 1000."""
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        with pytest.raises(tinystore.LimitError, match="database app: the result is over 67108864 bytes") as err:
            await db.all(f"select zeroblob(10000000) from {EIGHT_ROWS}")
        # the error names the limit to raise (as the frame limit's names frame_body_bytes), and the size wanted
        assert "sql_result_bytes" in err.value.message, err.value.message
        assert f"{err.value.wanted} bytes" in err.value.message


@pytest.mark.parametrize("mode", ["embedded", "private", "tcp"])
async def test_the_result_limit_holds_for_any_row_count(tmp_path: Path, mode: str) -> None:
    limits = tinystore.Limits(sql_result_bytes=100_000)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, b blob)")
        await db.exec("insert into t (b) values (zeroblob(60000)), (zeroblob(60000))")
        # two rows, 120 kB: db.all, db.exec returning, a transaction's read
        with pytest.raises(tinystore.LimitError, match="over 100000 bytes") as err:
            await db.all("select b from t")
        assert err.value.limit == 100_000 and (err.value.wanted or 0) > 100_000
        with pytest.raises(tinystore.LimitError, match="over 100000 bytes"):
            await db.exec("update t set b = b returning b")

        async def read_all(tx: tinystore.SqlTx) -> object:
            return await tx.all("select b from t")

        with pytest.raises(tinystore.LimitError, match="over 100000 bytes"):
            await db.tx(read_all, read_only=True)
        # one row over the limit: db.one, db.scalar, a text value
        with pytest.raises(tinystore.LimitError, match="over 100000 bytes"):
            await db.one("select zeroblob(200000) as b")
        with pytest.raises(tinystore.LimitError, match="over 100000 bytes"):
            await db.scalar("select zeroblob(200000)")
        with pytest.raises(tinystore.LimitError, match="over 100000 bytes"):
            await db.one("select b || b as bb from t where id = 1")
        with pytest.raises(tinystore.LimitError, match="over 100000 bytes"):
            await db.all("select hex(zeroblob(60000)) as h")
        # under the limit: as before
        row = await db.one("select b from t where id = 1")
        assert row is not None and row["b"] == bytes(60000)
        assert len(await db.all("select length(b) as n from t")) == 2
        assert await db.all("select 1 as a where 0") == []


# contract: STORE-04
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_many_small_rows_count_what_they_cost_in_memory(tmp_path: Path, mode: str) -> None:
    # from trial AO: 5 million one-integer rows were 10 MB encoded and 278 MB in the server; each row now counts
    # 56 bytes more and 24 a column
    many = "with recursive c(x) as (select 1 union all select x + 1 from c limit ?) select x from c"
    limits = tinystore.Limits(sql_result_bytes=1 << 20)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app")
        assert len(await db.all(many, 10_000)) == 10_000  # about 30 KB encoded, 800 KB in all
        with pytest.raises(tinystore.LimitError, match=r"counted 80 bytes more: what it costs in memory"):
            await db.all(many, 20_000)  # about 60 KB encoded: under the limit by its encoding alone
        assert await db.scalar("select 1") == 1
