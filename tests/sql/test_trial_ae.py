"""Trial AE (a new user, then an attacker, of the day's features): what it found in SQL."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store

MODES = ["embedded", "sidecar"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_temp_trigger_named_by_its_schema_is_refused_too(mode: str, tmp_path: Path) -> None:
    """``create trigger temp.spy ... on t`` got past the refusal of TEMP triggers (SQLite reports it as a trigger
    of main's t, then a row of the TEMP schema): it fired on every client's writes, unseen and not droppable."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        await db.exec("create table t (id integer primary key, v)")
        for sql in (
            "create trigger temp.spy after insert on t begin update t set v = 'seen' where id = new.id; end",
            "create trigger TEMP.spy before insert on t begin select raise(abort, 'no'); end",
            "create view temp.v as select 1",
            "create table temp.x (a)",
        ):
            with pytest.raises(tinystore.InvalidError, match="TEMP"):
                await db.exec(sql)
        await db.exec("insert into t (v) values ('mine')")
        assert await db.all("select v from t") == [{"v": "mine"}]


@pytest.mark.parametrize("mode", MODES)
async def test_last_insert_rowid_through_a_view_or_a_trigger_is_the_clients_own(mode: str, tmp_path: Path) -> None:
    """The writer set the value only for statements whose words name the function: a view or a trigger that
    calls it gave another client's rowid."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database(
            "app",
            migrations=[
                (
                    "001.sql",
                    "create table secret (id integer primary key);"
                    "create table t (id integer primary key, v, seen);"
                    "create trigger t_seen after update of v on t begin"
                    "  update t set seen = last_insert_rowid() where id = new.id; end;"
                    "create view lr as select last_insert_rowid() as r;"
                    "insert into t (v) values ('a');",
                )
            ],
        )
        await db.exec("insert into secret (id) values (777777)")  # as another client's
        await db.exec("update t set v = 'b' where id = 1")
        assert await db.scalar("select seen from t where id = 1") == 0
        await db.exec("insert into secret (id) values (888888)")
        assert (await db.exec("select r from lr")).rows == [[0]]

        async def own(tx: tinystore.SqlTx) -> tuple[object, object]:
            before = await tx.scalar("select r from lr")
            done = await tx.exec("insert into t (v) values ('c')")
            await tx.exec("insert into t (v, seen) select 'd', r from lr")
            return before, (done.last_insert_rowid, await tx.scalar("select seen from t where v = 'd'"))

        assert await db.tx(own) == (0, (2, 2))
