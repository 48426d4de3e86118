"""What no client may do to a database, whatever its token (trial S): write, make or drop the store's own tables
(``_tinystore_migrations``, the jobs tables of a database that holds queues), set ``PRAGMA schema_version``, or
call ``fts3_tokenizer``. The engines' own statements still write those tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError

REFUSED = [
    ("insert into _tinystore_migrations (name, text, applied_at) values ('002.sql', 'x', 0)", "_tinystore_migrations"),
    ("delete from _tinystore_migrations", "_tinystore_migrations"),
    ("update _tinystore_jobs set state = 'dead'", "_tinystore_jobs"),
    ("drop table _tinystore_jobs", "_tinystore_jobs"),
    ("alter table _tinystore_migrations add column x", "_tinystore_migrations"),
    ("create index _tinystore_x on t (a)", "_tinystore_x"),
    ("create index i on _tinystore_jobs (state)", "_tinystore_jobs"),
    ("create trigger tr after insert on _tinystore_jobs begin select 1; end", "_tinystore_jobs"),
    ("create table _tinystore_queues (a)", "_tinystore_queues"),
    ("pragma schema_version = 1", "PRAGMA schema_version"),
]


async def test_clients_cannot_touch_the_store_tables(any_store: tinystore.Store) -> None:
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a)")])
    mail = any_store.queue("mail", database=db)
    await mail.add({"to": "a@x"})
    for sql, named in REFUSED:
        with pytest.raises(InvalidError) as info:
            await db.exec(sql)
        assert named in info.value.message, (sql, info.value.message)

        async def in_tx(tx: tinystore.SqlTx, sql: str = sql) -> None:
            await tx.exec(sql)

        with pytest.raises(InvalidError):
            await db.tx(in_tx)
    # a trigger of a client's table that writes them is refused as it is made (trial IF: it was made, SQLite looking
    # into its body only as it fires, and every later insert into t was refused); one that reads them is made
    schema = await db.all("select name, sql from sqlite_schema order by name")
    for trigger in (
        "create trigger tr after insert on t begin delete from _tinystore_jobs; end",
        "create trigger tr before update of a on t begin update _tinystore_jobs set key = 'x'; end",
        'create trigger "t r" after delete on t when 1 begin insert into "_TinyStore_jobs" (id) values (1); end',
        # trial IK: SQLite fires "update of rowid" (oid, _rowid_) for an update that sets the rowid by that name
        "create trigger tr after update of rowid on t begin delete from _tinystore_jobs; end",
        "create trigger tr after update of OID on t begin delete from _tinystore_jobs; end",
        "create trigger tr after update of _rowid_ on t begin delete from _tinystore_jobs; end",
    ):
        for attempt in ("exec", "tx"):
            with pytest.raises(InvalidError, match=r"trigger .* is refused.*_tinystore_jobs belongs to the store"):
                if attempt == "exec":
                    await db.exec(trigger)
                else:
                    await db.tx(lambda tx, sql=trigger: tx.exec(sql))
        assert await db.all("select name, sql from sqlite_schema order by name") == schema
    await db.exec("create view v as select a from t")
    with pytest.raises(InvalidError, match="trigger vt of v is refused"):
        await db.exec("create trigger vt instead of insert on v begin delete from _tinystore_migrations; end")
    with pytest.raises(InvalidError, match="belongs to the store"):
        await any_store.database(
            "app",
            migrations=[
                ("001.sql", "create table t (a)"),
                ("002.sql", "create trigger tm after insert on t begin delete from _tinystore_jobs; end"),
            ],
        )
    await db.exec(
        "create trigger tr after insert on t begin select count(*) from _tinystore_jobs; end"  # (reads: made)
    )
    # (a table without a rowid has none to set: its reading trigger is made too)
    await db.exec("create table wr (a primary key) without rowid")
    await db.exec("create trigger twr after update on wr begin select count(*) from _tinystore_jobs; end")
    # (trial IM: nor one of a table without a rowid whose column is named rowid, and that has no oid)
    await db.exec("create table wr2 (k primary key, rowid) without rowid")
    await db.exec("create trigger twr2 after update on wr2 begin select count(*) from _tinystore_jobs; end")
    await db.exec("insert into t values (1)")
    # trial IG: with one trigger of t naming a store's table, the statements the check prepared were found in
    # sqlite3's cache, not prepared again: a second trigger that writes one was made
    with pytest.raises(InvalidError, match="_tinystore_jobs belongs to the store"):
        await db.exec("create trigger tr2 after insert on t begin delete from _tinystore_jobs; end")
    await db.exec("drop trigger tr")
    with pytest.raises(InvalidError, match="_tinystore_jobs belongs to the store"):
        await db.exec("create trigger tr after insert on t begin delete from _tinystore_jobs; end")
    # ... and one whose body names a table not made yet cannot be judged: refused while it names the store's
    with pytest.raises(InvalidError, match=r"cannot be judged now .*no such table"):
        await db.exec(
            "create trigger tr3 after insert on t begin insert into yy values (1); delete from _tinystore_jobs; end"
        )
    # ... nor one whose body writes another view first (trial II: its error, "because it is a view", was taken for
    # the trigger's own view's, and the write after it never judged)
    with pytest.raises(InvalidError, match=r"trigger tv of t is refused"):
        await db.exec(
            "create trigger tv after insert on t begin insert into v values (1); delete from _tinystore_jobs; end"
        )
    await db.exec("drop view v")
    other = await any_store.database("other", migrations=[("001.sql", "create table t1 (a)")])
    with pytest.raises(InvalidError, match=r"cannot be judged now .*no such table: main\._tinystore_jobs"):
        # (before the database holds a queue: no such table yet)
        await other.exec(
            "create trigger t1j after insert on t1 begin insert into _tinystore_jobs (id) values ('x'); end"
        )
    assert await other.scalar("select count(*) from sqlite_schema where type = 'trigger'") == 0
    with pytest.raises(InvalidError, match="fts3_tokenizer is refused"):
        await db.scalar("select fts3_tokenizer('simple')")
    # untouched, and the engines still write them: a migration recorded, a job added, run and ended
    assert await db.all("select name from _tinystore_migrations") == [{"name": "001.sql"}]
    db = await any_store.database(
        "app", migrations=[("001.sql", "create table t (a)"), ("002.sql", "create table u (b)")]
    )
    assert await db.scalar("select count(*) from _tinystore_migrations") == 2
    await mail.add({"to": "b@x"})
    assert await mail.run_due(lambda value, run: None) == 2
    assert await db.scalar("select count(*) from _tinystore_jobs where state = 'succeeded'") == 2
    assert await db.scalar("pragma schema_version") > 0  # reading it is fine


async def test_the_engines_rights_never_come_from_a_statements_text(tmp_path: Path) -> None:
    # trial V: the mark of the engines' statements ended their text, SQLite kept it in sqlite_master (readable by
    # any token), and any statement ending with it ran with the engine's rights (query_only set on the writer,
    # forged migration records)
    from tinystore.engines import sql_guard

    async with await tinystore.open(tmp_path / "s", embedded=True, serve=False) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (a)")])
        await store.queue("mail", database=db).add({"to": "a@x"})
        schema = " ".join(r["sql"] or "" for r in await db.all("select sql from sqlite_master"))
        schema += " ".join(
            r["sql"] or "" for r in await (await store.database("tinystore-jobs")).all("select sql from sqlite_master")
        )
        assert sql_guard._OWN_MARK.strip() not in schema and sql_guard._CTL_TAG.strip() not in schema
        for text in (
            "insert into _tinystore_migrations (name, text, applied_at) values ('x', 'y', 0)",
            "pragma query_only = 1",
            "pragma schema_version = 1",
        ):
            for marked in (sql_guard._OWN_MARK + text, text + sql_guard._CTL_TAG):
                with pytest.raises(InvalidError, match="not allowed here"):
                    await db.exec(marked)
        await db.exec("insert into t values (1)")  # the writer still writes
        assert await db.scalar("select count(*) from _tinystore_migrations") == 1


# contract: SQL-06
@pytest.mark.parametrize(
    "sql",
    [
        "alter table t rename to _tinystore_y",
        'alter table t rename to "_TinyStore_x"',
        "create table refs (job text references _tinystore_jobs (id))",
        'create table refs (job text, foreign key (job) references "_tinystore_jobs" (id))',
        "alter table t add column job text references _tinystore_jobs (id)",
    ],
)
async def test_a_client_cannot_make_a_store_table_nor_point_at_one(any_store: tinystore.Store, sql: str) -> None:
    # from trial BB: a table renamed _tinystore_jobs took the store's name (the queue of that database failed, and
    # the table could be dropped no more); a foreign key to _tinystore_jobs stopped the deletion of ended jobs
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a)")])
    mail = any_store.queue("mail", database=db)
    await mail.add({"to": "a@x"})
    schema = await db.all("select type, name, sql from sqlite_schema order by name")
    for attempt in ("exec", "tx"):
        with pytest.raises(InvalidError) as info:
            if attempt == "exec":
                await db.exec(sql)
            else:
                await db.tx(lambda tx: tx.exec(sql))
        assert "belongs to the store" in info.value.message, info.value.message
        assert "database app" in info.value.message or "_tinystore" in info.value.message
        assert await db.all("select type, name, sql from sqlite_schema order by name") == schema
    with pytest.raises(InvalidError, match="belongs to the store"):
        await any_store.database("app", migrations=[("001.sql", "create table t (a)"), ("002.sql", sql)])
    assert await db.all("select type, name, sql from sqlite_schema order by name") == schema
    assert await mail.run_due(lambda value, run: None) == 1  # the queue works, and so does the session
    await db.exec("insert into t values (1)")


# contract: SQL-05
async def test_schema_changes_that_do_not_name_the_store_tables_are_not_checked_against_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from trial BD: the check read every table's foreign keys before and after each schema change: a migration
    # of 2,000 CREATE TABLEs took 12 s instead of 0.2 s. A statement can name the store's tables only in its text
    from tinystore.engines import sql as sql_engine
    from tinystore.engines.sql_guard import names_own

    assert not names_own("create table t (a text references u (id))")
    assert names_own('create table t (a text references "_TinyStore_jobs" (id))')
    assert names_own("alter table t rename to [_TINYSTORE_x]")
    calls: list[int] = []
    real = sql_engine.own_objects  # type: ignore[attr-defined]

    def counted(conn: Any) -> frozenset[str]:
        calls.append(1)
        return real(conn)

    monkeypatch.setattr(sql_engine, "own_objects", counted)
    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:
        text = "\n".join(f"create table t{i} (a integer references t0 (a));" for i in range(1, 200))
        db = await store.database(
            "app", migrations=[("001.sql", "create table t0 (a integer primary key);"), ("002.sql", text)]
        )
        await db.exec("create table more (a)")
        assert calls == []
        with pytest.raises(InvalidError, match="belongs to the store"):
            await db.exec("create table bad (a references _tinystore_migrations (name))")
        assert calls
    finally:
        await store.close()
