"""Trials GU and GW: what the server keeps for a database name is let go once nothing opens it: each name whose open
failed (a first migration that does not run, its file removed) kept a lock in the engine for the server's life."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

import tinystore


async def test_names_whose_open_failed_leave_nothing_behind(tmp_path: Path) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        engine = store._core.sql  # type: ignore[attr-defined]
        for i in range(40):
            with pytest.raises(tinystore.InvalidError):
                await store.database(f"n{i}", migrations=[("001.sql", "create tablx oops")])
        assert len(engine._opening) == 0
        assert not list((tmp_path / "s" / "sql").glob("n*.db"))
        # opens of one name at once still take their turns: one makes it, the others find it made
        dbs = await asyncio.gather(
            *(store.database("app", migrations=[("001.sql", "create table t (v)")]) for _ in range(5))
        )
        await dbs[0].exec("insert into t values (1)")
        assert await dbs[4].scalar("select count(*) from t") == 1
        assert len(engine._opening) == 0
        # a cancelled open lets go too, once its start has ended
        opening = asyncio.ensure_future(store.database("other", migrations=[("001.sql", "create table u (v)")]))
        await asyncio.sleep(0)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        db = await store.database("other", migrations=[("001.sql", "create table u (v)")])
        assert await db.scalar("select count(*) from u") == 0
        for _ in range(100):
            if not engine._opening:
                break
            await asyncio.sleep(0.01)
        assert len(engine._opening) == 0
    finally:
        await store.close()


@pytest.mark.parametrize("placeholder", [":a", "?"])
async def test_a_migration_with_a_placeholder_says_so(tmp_path: Path, placeholder: str) -> None:
    # trial GW: SQLite's "Incorrect number of bindings supplied..." where db.exec names the placeholder
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        migrations = [("1.sql", f"create table x (v);\ninsert into x values ({placeholder})")]
        with pytest.raises(
            tinystore.InvalidError,
            match=rf"^database np: migration 1.sql: the statement has (the|a) (placeholder )?{re.escape(placeholder)}"
            "( placeholder)?: a "
            "migration takes no parameters",
        ):
            await store.database("np", migrations=migrations)
    finally:
        await store.close()


@pytest.mark.parametrize("placeholder", [":a", "?"])
async def test_a_new_migration_of_an_open_database_with_a_placeholder_says_so(tmp_path: Path, placeholder: str) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        await store.database("np", migrations=[("1.sql", "create table x (v)")])
        migrations = [("1.sql", "create table x (v)"), ("2.sql", f"insert into x values ({placeholder})")]
        with pytest.raises(
            tinystore.InvalidError,
            match=rf"^database np: migration 2.sql: the statement has (the|a) (placeholder )?{re.escape(placeholder)}"
            "( placeholder)?: a "
            "migration takes no parameters",
        ):
            await store.database("np", migrations=migrations)
    finally:
        await store.close()


async def test_a_migration_failing_otherwise_keeps_its_own_error(tmp_path: Path) -> None:
    # trial GX: a CHECK whose text held "number of bindings" was reported as a placeholder
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        migrations = [
            (
                "1.sql",
                "create table n (note text check (note not like '%number of bindings%'));\n"
                "insert into n values ('the number of bindings')",
            )
        ]
        with pytest.raises(tinystore.InvalidError, match=r"migration 1\.sql: CHECK constraint failed"):
            await store.database("np", migrations=migrations)
    finally:
        await store.close()
