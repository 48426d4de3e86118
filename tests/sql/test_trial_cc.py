"""From trial CC: a new user porting an application from sqlite3 / aiosqlite."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
from pathlib import Path
from typing import Any

import msgspec
import pytest

import tinystore
from tests.helpers import open_store, sqlite_file
from tinystore import ConflictError, InvalidError

BASE = (
    "001_init.sql",
    "create table users (id integer primary key, email text);\n"
    "create table posts (id integer primary key, user_id int not null references users(id) on delete cascade,"
    " body text);\n"
    "insert into users values (1, 'a'), (2, 'b');\n"
    "insert into posts values (1, 1, 'x'), (2, 1, 'y'), (3, 2, 'z');",
)
# SQLite's procedure for a change ALTER TABLE cannot make (https://sqlite.org/lang_altertable.html#otheralter),
# as written there (its PRAGMA foreign_keys lines) and without them
REBUILD = (
    "create table users_new (id integer primary key, email text not null unique);\n"
    "insert into users_new select id, email from users;\n"
    "drop table users;\n"
    "alter table users_new rename to users;\n"
    "pragma foreign_key_check;"
)


# contract: SQL-05
@pytest.mark.parametrize("pragmas", [False, True])
@pytest.mark.parametrize("open_first", [False, True])
async def test_a_table_rebuilt_by_a_migration_keeps_its_childrens_rows(
    store: tinystore.Store, pragmas: bool, open_first: bool
) -> None:
    """The DROP of the old table ran with foreign keys on, and its implicit DELETE cascaded: every post was
    silently deleted (sqlite3, whose foreign keys are off unless asked, kept them). At the open of the database,
    and on a database open already."""
    text = f"PRAGMA foreign_keys=OFF;\n{REBUILD}\nPRAGMA foreign_keys = on;" if pragmas else REBUILD
    if open_first:
        await store.database("app", migrations=[BASE])
    db = await store.database("app", migrations=[BASE, ("002_email_unique.sql", text)])
    assert await db.scalar("select count(*) from posts") == 3
    assert "unique" in await db.scalar("select sql from sqlite_master where name = 'users'")
    # foreign keys hold again after it: an orphan is refused, a cascade cascades
    with pytest.raises(ConflictError):
        await db.exec("insert into posts values (9, 99, 'orphan')")
    await db.exec("delete from users where id = 1")
    assert await db.scalar("select count(*) from posts") == 1


# contract: SQL-05
async def test_a_migration_that_leaves_orphans_fails_whole_naming_them(store: tinystore.Store) -> None:
    """With foreign keys off, a migration that counted on ON DELETE CASCADE would leave child rows without their
    parent: it fails before its commit, naming them, and nothing of it is applied."""
    db = await store.database("app", migrations=[BASE])
    with pytest.raises(InvalidError) as info:
        await store.database(
            "app", migrations=[BASE, ("002_drop_a.sql", "delete from users where id = 1; create table z (x);")]
        )
    message = info.value.message
    assert message.startswith(
        "database app: migration 002_drop_a.sql: it leaves rows whose foreign key finds no parent"
    )
    assert "posts row 1 -> users, posts row 2 -> users" in message and "nothing of it was applied" in message
    assert await db.scalar("select count(*) from users") == 2
    assert await db.scalar("select count(*) from sqlite_master where name = 'z'") == 0
    # done in the migration itself, it applies
    fixed = "delete from posts where user_id = 1; delete from users where id = 1; create table z (x);"
    await store.database("app", migrations=[BASE, ("002_drop_a.sql", fixed)])
    assert await db.scalar("select count(*) from posts") == 1


# contract: SQL-05
async def test_a_migration_of_comments_only_is_applied(store: tinystore.Store) -> None:
    """Flyway and others take an empty migration (a placeholder): it was refused, "no statement"."""
    migrations = [
        BASE,
        ("002_later.sql", "-- nothing yet\n/* still nothing */ ;\n"),
        ("003.sql", "create table c (x);"),
    ]
    db = await store.database("app", migrations=migrations)
    names = await db.all("select name from _tinystore_migrations order by name")
    assert [r["name"] for r in names] == ["001_init.sql", "002_later.sql", "003.sql"]


# contract: SQL-04
async def test_bad_json_or_search_text_is_the_statements_error_not_a_corrupt_file(store: tinystore.Store) -> None:
    """ "malformed JSON" (json()) and "malformed MATCH expression" (full-text search) are SQLite's SQLITE_ERROR
    about a statement's input: they were told as ``CorruptError`` (a damaged file), for a user's bad input."""
    db = await store.database(
        "app", migrations=[("1.sql", "create table ev (body text); create virtual table f using fts4(t);")]
    )
    bad = '{"name": "bob"'
    for call in (
        lambda: db.exec("insert into ev (body) values (json(?))", bad),
        lambda: db.scalar("select ? ->> '$.name'", bad),
        lambda: db.tx(lambda tx: tx.scalar("select json_extract(?, '$.a')", bad)),
        lambda: db.all("select * from f where f match ?", "a OR"),
    ):
        with pytest.raises(InvalidError) as info:
            await call()
        assert type(info.value) is InvalidError and "malformed" in info.value.message, info.value
    assert await db.scalar("pragma integrity_check") == "ok"
    assert await db.scalar("select count(*) from ev") == 0


# contract: SQL-04
async def test_a_checkpoint_in_a_read_is_refused_and_holds_no_write(store: tinystore.Store) -> None:
    """On a reader's connection, a TRUNCATE checkpoint waited for an open read-only transaction while it held the
    writer's lock: every write waited (4 s here; up to tx_max), and neither statement_timeout nor a cancel stopped
    it. Through a read it is refused; through exec it runs alone on the writer."""
    db = await store.database("app", migrations=[("1.sql", "create table t (x);")])
    await db.exec("insert into t values (1)")
    snapshot_open = asyncio.Event()
    release = asyncio.Event()

    async def report(tx: tinystore.SqlTx) -> int:
        n = await tx.scalar("select count(*) from t")
        snapshot_open.set()
        await release.wait()
        return int(n)

    reader = asyncio.ensure_future(db.tx(report, read_only=True))
    try:
        await snapshot_open.wait()
        for sql in (
            "pragma wal_checkpoint(TRUNCATE)",
            "PRAGMA main.wal_checkpoint",
            "/* c */ pragma wal_checkpoint(restart)",
        ):
            with pytest.raises(
                InvalidError, match=r"PRAGMA wal_checkpoint writes: it runs alone on the writer \(db\.exec"
            ):
                await db.all(sql)
        with pytest.raises(InvalidError, match="wal_checkpoint"):
            await db.tx(lambda tx: tx.all("pragma wal_checkpoint(truncate)"), read_only=True)
        await asyncio.wait_for(db.exec("insert into t values (2)"), 2)  # not held
    finally:
        release.set()
        assert await reader == 1
    await db.exec("pragma wal_checkpoint(truncate)")


@dataclasses.dataclass
class Row:
    id: int
    flag: bool | None = None
    data: bytes | None = None
    n: int | None = None
    at: datetime.datetime | None = None


class StructRow(msgspec.Struct, rename="camel"):
    is_on: bool


async def test_typed_rows_take_values_as_sqlite_gives_them(store: tinystore.Store) -> None:
    """Typed rows converted leniently: a text column read as bytes was base64-decoded (wrong bytes, silently),
    'false' became False, '12' became 12, 'nan' a NaN. Only bool from 0/1 (SQLite's booleans), float from an
    integer and ISO 8601 times are taken now."""
    db = await store.database("app", migrations=[("1.sql", "create table t (id integer primary key, v);")])
    assert await db.one(Row, "select 1 as id, 1 as flag, x'00ff' as data, 7 as n, '2026-12-03T10:00:00' as at") == Row(
        1, True, b"\x00\xff", 7, datetime.datetime(2026, 12, 3, 10)
    )
    assert await db.all(Row, "select 2 as id, 0 as flag") == [Row(2, False)]
    assert await db.one(StructRow, "select 1 as isOn") == StructRow(True)
    for sql in (
        "select 1 as id, 'text' as data",  # (valid base64: it gave b'\xb5\xecm')
        "select 1 as id, 'false' as flag",
        "select 1 as id, 2 as flag",
        "select 1 as id, '12' as n",
        "select '1' as id",
    ):
        with pytest.raises(InvalidError, match=r"database app: a row does not fit Row: "):
            await db.one(Row, sql)


async def test_sql_text_of_a_str_subclass_works_in_every_call(store: tinystore.Store) -> None:
    class Q(enum.StrEnum):
        COUNT = "select count(*) as n from t"
        ADD = "insert into t (x) values (?)"

    db = await store.database("app", migrations=[("1.sql", "create table t (x);")])
    await db.exec(Q.ADD, 1)
    assert await db.scalar(Q.COUNT) == 1
    assert await db.one(Q.COUNT) == {"n": 1}
    assert await db.all(Q.COUNT) == [{"n": 1}]

    async def both(tx: tinystore.SqlTx) -> Any:
        await tx.exec(Q.ADD, 2)
        return await tx.scalar(Q.COUNT), await tx.one(Q.COUNT)

    assert await db.tx(both) == (2, {"n": 2})


async def test_hidden_files_of_a_migrations_folder_are_passed_over(tmp_path: Path) -> None:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "001_init.sql").write_text("create table t (x);")
    (folder / ".#002_wip.sql").symlink_to(tmp_path / "nowhere")  # Emacs' lock file, while 002 is edited
    (folder / "._001_init.sql").write_bytes(b"\x00\x05\x16\x07\xff\xfe")  # macOS's AppleDouble file
    (folder / ".hidden.sql").write_text("create table hidden (x);")
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=folder)
        assert [r["name"] for r in await db.all("select name from _tinystore_migrations")] == ["001_init.sql"]
        (folder / "002_unreadable.sql").symlink_to(tmp_path / "gone.sql")
        with pytest.raises(InvalidError, match=r"database app: migrations: .*002_unreadable\.sql cannot be read"):
            await store.database("app", migrations=folder)


async def test_a_strict_columns_type_error_has_sqlites_code(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (qty int) strict;")])
    with pytest.raises(ConflictError) as info:
        await db.exec("insert into t values ('x')")
    assert info.value.extra["sqlite_code"] == "SQLITE_CONSTRAINT_DATATYPE"


async def test_errors_that_say_what_to_do(store: tinystore.Store) -> None:
    db = await store.database("app")
    with pytest.raises(InvalidError, match=r"parameter 1: a tuple is not a SQL value .*db\.one\(sql, \*values\)"):
        await db.one("select ? as a", (1, 2))
    small = await store.database("app")
    with pytest.raises(tinystore.LimitError, match=r"read it in pages .* or raise Limits\.sql_result_bytes"):
        await small.all(
            "with recursive c(v) as (select 1 union all select v + 1 from c where v < 3000000) select v from c"
        )


# contract: SQL-05
@pytest.mark.parametrize("open_first", [False, True])
async def test_orphans_from_before_do_not_stop_a_migration(tmp_path: Path, open_first: bool) -> None:
    """A database brought from sqlite3 (foreign keys off unless asked) may hold child rows without a parent: only
    the orphans a migration makes fail it."""
    sqlite_file(
        tmp_path / "s" / "sql" / "app.db", BASE[1] + "\ninsert into posts values (4, 99, 'orphan from before');"
    )
    async with open_store("embedded", tmp_path / "s") as store:
        if open_first:
            await store.database("app")
        db = await store.database("app", migrations=[("002_email_unique.sql", REBUILD)])
        assert await db.scalar("select count(*) from posts") == 4
        with pytest.raises(InvalidError, match=r"posts row 3 -> users\. Migrations run"):
            await store.database(
                "app", migrations=[("002_email_unique.sql", REBUILD), ("003.sql", "delete from users where id = 2;")]
            )
