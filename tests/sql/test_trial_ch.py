"""From trial CH: a tester breaking the fixes of trials CC-CF (migrations' orphan check, checkpoints, typed
rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec
import pytest

import tinystore
from tests.helpers import open_store, sqlite_file
from tinystore import InvalidError

PARENTS = (
    "001.sql",
    "create table p (id integer primary key, n text);"
    "create table c (id integer primary key, pid int references p(id));"
    "insert into p values (1, 'a'); insert into c values (10, 1);",
)


# contract: SQL-05
@pytest.mark.parametrize("open_first", [False, True])
@pytest.mark.parametrize("where", ["before", "itself"])
async def test_a_foreign_key_mismatch_elsewhere_does_not_turn_the_orphan_check_off(
    tmp_path: Path, open_first: bool, where: str
) -> None:
    """One foreign key of the schema whose parent column is no key ("foreign key mismatch") made the whole check
    skipped: a migration deleted c's parent and left the orphan, which a plain exec refuses."""
    legacy = "create table legacy (x text references p(n));"
    migrations = [PARENTS] if where == "itself" else [(PARENTS[0], PARENTS[1] + legacy)]
    deletes = ("002.sql", "delete from p where id = 1;" + (legacy if where == "itself" else ""))
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=migrations)
        if not open_first:
            await store.close()
            store = await tinystore.open(tmp_path / "s", embedded=True)
        try:
            with pytest.raises(InvalidError, match=r"migration 002\.sql: it leaves rows whose foreign key finds no "
                               r"parent: c row 10 -> p\."):  # fmt: skip
                await store.database("app", migrations=[*migrations, deletes])
            db = await store.database("app")
            assert await db.scalar("select count(*) from p") == 1
        finally:
            if not open_first:
                await store.close()


# contract: SQL-05
@pytest.mark.parametrize("open_first", [False, True])
async def test_an_old_orphan_deleted_does_not_pay_for_a_new_one(tmp_path: Path, open_first: bool) -> None:
    """Counted in all, a migration that deleted an orphan from before (c row 10) could leave one of its own
    elsewhere (k row 20): the docs promise that one that leaves a child row without its parent fails."""
    sqlite_file(
        tmp_path / "s" / "sql" / "app.db",
        "create table p (id integer primary key);"
        "create table c (id integer primary key, pid int references p(id));"
        "create table k (id integer primary key, pid int references p(id));"
        "insert into p values (1); insert into c values (10, 99); insert into k values (20, 1);",
    )
    async with open_store("embedded", tmp_path / "s") as store:
        if open_first:
            await store.database("app")
        step = ("002.sql", "delete from c where id = 10; delete from p where id = 1;")
        with pytest.raises(InvalidError, match=r"migration 002\.sql: it leaves rows .*: k row 20 -> p\."):
            await store.database("app", migrations=[step])
        db = await store.database("app")
        assert await db.scalar("select count(*) from c") == 1
        # (renamed, a table keeps its old orphans: not the migration's)
        await store.database("app", migrations=[("002.sql", "alter table c rename to c2;")])
        assert await db.scalar("select count(*) from c2") == 1


class Tagged(msgspec.Struct, tag="a"):
    v: bool


class Counted(msgspec.Struct, tag="b"):
    v: int


class Flagged(msgspec.Struct):
    ok: Literal[True]


# contract: SQL-04
async def test_typed_rows_of_a_tagged_union_read_each_members_bools(store: tinystore.Store) -> None:
    """The 0/1 of a bool column was applied by column name across a union's members: ``Tagged.v: bool`` made
    ``Counted.v: int`` get ``True`` and fail. A ``Literal[True]`` field refused SQLite's 1."""
    db = await store.database("app")
    assert await db.one(Tagged | Counted, "select 'b' as type, 1 as v") == Counted(v=1)
    assert await db.one(Tagged | Counted, "select 'a' as type, 1 as v") == Tagged(v=True)
    assert await db.one(Flagged, "select 1 as ok") == Flagged(ok=True)
    with pytest.raises(InvalidError, match="does not fit"):
        await db.one(Flagged, "select 0 as ok")
