"""Trial CZ: a statement of a transaction that runs on past the transaction's tx_max; the SQLite code of a
constraint that rolled the whole transaction back; a type given where the SQL text goes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import drop_connection, open_store

ENDLESS_READ = "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c"
ENDLESS_WRITE = (
    "insert into t (a) select x from (with recursive c(x) as (select 1 union all select x + 1 from c) select x from c)"
)
LIMITS = tinystore.Limits(tx_max=1.0, statement_timeout=20.0)


# contract: SQL-03
@pytest.mark.parametrize("mode", ["embedded", "private"])
@pytest.mark.parametrize("kind", ["read", "write", "read_only"])
async def test_a_statement_of_a_transaction_is_stopped_at_the_transactions_tx_max(
    tmp_path: Path, mode: str, kind: str
) -> None:
    # a statement ran on to its own statement_timeout (30 s by default), past tx_max, keeping the writer that long
    async with open_store(mode, tmp_path / "s", limits=LIMITS) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (id integer primary key, a)")])
        t0 = time.monotonic()

        async def fn(tx: Any) -> Any:
            if kind == "read_only":
                return await tx.scalar(ENDLESS_READ)
            await tx.exec("insert into t (a) values ('tx')")
            if kind == "read":
                return await tx.scalar(ENDLESS_READ)
            return await tx.exec(ENDLESS_WRITE)

        async def other_writer() -> float:
            await asyncio.sleep(0.3)
            await db.exec("insert into t (a) values ('other')")
            return time.monotonic() - t0

        with pytest.raises(tinystore.TimeoutError_, match=r"transaction \d+ ran past tx_max \(1s\) and was rolled"):
            await db.tx(fn, read_only=kind == "read_only")
        took = time.monotonic() - t0
        assert took < 8, took  # (at tx_max, 1 s; it was the statement's own limit, 20 s here)
        if kind != "read_only":
            assert await other_writer() < 8
        assert await db.all("select a from t") == [{"a": "other"}] if kind != "read_only" else True
        assert await db.scalar("select count(*) from t where a = 'tx'") == 0  # rolled back


# contract: SQL-06
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_constraint_that_rolled_the_transaction_back_carries_its_sqlite_code(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table u (id integer primary key, v unique)")])
        await db.exec("insert into u (v) values (1)")
        sql = "insert or rollback into u (v) values (1)"
        with pytest.raises(tinystore.ConflictError) as by_exec:
            await db.exec(sql)
        assert by_exec.value.extra.get("sqlite_code") == "SQLITE_CONSTRAINT_UNIQUE"
        seen: list[tinystore.ConflictError] = []

        async def fn(tx: Any) -> None:
            try:
                await tx.exec(sql)
            except tinystore.ConflictError as exc:
                seen.append(exc)

        with pytest.raises(tinystore.ConflictError) as by_tx:
            await db.tx(fn)
        assert seen and seen[0].extra.get("sqlite_code") == "SQLITE_CONSTRAINT_UNIQUE", seen
        assert "rolled back the whole transaction" in seen[0].message
        assert by_tx.value.extra.get("sqlite_code") == "SQLITE_CONSTRAINT_UNIQUE", by_tx.value.extra
        # trial EG: in a migration, not "transaction 2" (a number the client never saw)
        with pytest.raises(tinystore.InvalidError) as by_migration:
            await store.database(
                "app",
                migrations=[
                    ("001.sql", "create table u (id integer primary key, v unique)"),
                    ("002.sql", "insert into u (v) values (2); " + sql),
                ],
            )
        assert "this rolled back the migration's whole transaction, which has ended" in by_migration.value.message


# contract: STORE-06
@pytest.mark.parametrize("under_way", [True, False])
async def test_a_dropped_connection_under_a_transaction_is_one_error_whatever_the_timing(
    tmp_path: Path, under_way: bool
) -> None:
    # the same event raised ClosedError when a call of the transaction was under way, UnavailableError when the
    # next call came after it
    async with open_store("private", tmp_path / "s", limits=LIMITS) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (id integer primary key, a)")])

        async def fn(tx: Any) -> None:
            await tx.exec("insert into t (a) values ('tx')")
            loop = asyncio.get_running_loop()
            if under_way:
                loop.call_later(0.3, drop_connection, store)
                await tx.scalar(ENDLESS_READ)
            else:
                drop_connection(store)
                await asyncio.sleep(0.5)
                await tx.exec("insert into t (a) values ('next')")

        with pytest.raises(tinystore.UnavailableError, match=r"transaction \d+.*was rolled back with it"):
            await asyncio.wait_for(db.tx(fn), 20)
        assert await db.scalar("select count(*) from t") == 0


# contract: SQL-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_migrations_over_what_one_open_carries_are_named_as_such(tmp_path: Path, mode: str) -> None:
    # every open sends all the migrations; past the frame limit it said "sql.open: the request is N bytes encoded"
    limits = tinystore.Limits(frame_body_bytes=1 << 20)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        big = [(f"{i:03}.sql", "insert into seed (v) values ('" + "z" * 300_000 + "')") for i in range(1, 5)]
        migrations = [("000.sql", "create table seed (i integer primary key, v text)"), *big]
        db = await store.database("app", migrations=migrations[:3])
        with pytest.raises(tinystore.LimitError) as caught:
            await store.database("app", migrations=migrations)
        message = caught.value.message
        assert message.startswith("database app: its 5 migrations hold 1200") and "'001.sql' (300032 bytes)" in message
        assert "every open of the database sends them all" in message and "frame_body_bytes" in message, message
        assert await db.scalar("select count(*) from seed") == 2  # nothing lost; the applied ones still open
        await store.database("app", migrations=migrations[:3])


# contract: SQL-06
async def test_a_generator_function_given_to_tx_is_refused_not_committed_unrun(tmp_path: Path) -> None:
    # its body never ran, and the transaction committed, returning the generator
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (x)")])

        async def fill(tx: Any) -> Any:
            await tx.exec("insert into t values (1)")
            yield 1

        def numbers(tx: Any) -> Any:
            yield 1

        for fn in (fill, numbers):
            with pytest.raises(tinystore.InvalidError, match=r"tx: .* is a generator function \(it holds a yield\)"):
                await db.tx(fn)
        assert await db.scalar("select count(*) from t") == 0
        assert await db.tx(lambda tx: tx.scalar("select 1")) == 1  # the writer is free
