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

        async def own(tx: tinystore.SqlTx) -> tuple[object, object, object]:
            before = await tx.scalar("select r from lr")
            done = await tx.exec("insert into t (v) values ('c')")
            await tx.exec("update t set v = 'e' where v = 'c'")  # its trigger sees the transaction's own
            # an insert that does not name it sees 0 through the view, and its Done stays exact (trial AF)
            await tx.exec("insert into t (v, seen) select 'd', r from lr")
            seen = await tx.all("select v, seen from t where v in ('e', 'd') order by id")
            return before, done.last_insert_rowid, seen

        assert await db.tx(own) == (0, 2, [{"v": "e", "seen": 2}, {"v": "d", "seen": 0}])

        await db.exec("create table k (id text primary key) without rowid")

        async def exact(tx: tinystore.SqlTx) -> tuple[int, int]:
            await tx.exec("insert into t (v) values ('f')")
            keyed = await tx.exec("insert into k (id) values ('a')")  # adds no rowid row
            upsert = await tx.exec("insert into t (id, v) values (1, 'g') on conflict (id) do update set v = 'g'")
            return keyed.last_insert_rowid, upsert.last_insert_rowid

        assert await db.tx(exact) == (0, 0)


@pytest.mark.parametrize("mode", MODES)
async def test_what_a_deferring_transaction_runs_shows_no_mark_of_the_engines(mode: str, tmp_path: Path) -> None:
    """Trial AF: the statements after ``pragma defer_foreign_keys`` had a mark appended, which an error (a text
    ending inside a quote) or a column name (inside a comment) showed."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        seen: list[str] = []

        async def deferring(tx: tinystore.SqlTx) -> None:
            await tx.exec("pragma defer_foreign_keys = on")
            for sql in ("select 'abc", 'select "abc', "select [abc"):
                with pytest.raises(tinystore.InvalidError) as info:
                    await tx.one(sql)
                seen.append(str(info.value))
            seen.extend((await tx.exec("select 1 /* note")).columns)

        await db.tx(deferring)
        assert seen[-1] == "1 /* note"
        assert not any("ts " in text for text in seen), seen
