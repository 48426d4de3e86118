"""Details a user of other SQLite layers relies on: migrations on a database already open, last_insert_rowid,
a transaction's statement that fails after it ran, read-only transactions inside others, arguments that are
not SQL text."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tests.helpers import open_store
from tinystore import ConflictError, InvalidError, LimitError


# contract: SQL-05
async def test_new_migrations_of_an_open_database_apply_each_in_its_own_transaction(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("001.sql", "create table a (x);")])
    with pytest.raises(InvalidError) as info:
        await store.database(
            "app",
            migrations=[
                ("001.sql", "create table a (x);"),
                ("002.sql", "create table b (x);"),
                ("003.sql", "create table c (x); create tabl oops (x);"),
            ],
        )
    message = info.value.message
    assert message.startswith("database app: migration 003.sql: ") and message.count("database app") == 1
    # 002 stays applied (its own transaction); nothing of 003 is left (not even its first statement)
    names = [r["name"] for r in await db.all("select name from sqlite_master where type = 'table' order by name")]
    assert "b" in names and "c" not in names
    # once fixed, 003 applies; 002 is not applied twice
    await store.database("app", migrations=[("002.sql", "create table b (x);"), ("003.sql", "create table c (x);")])
    assert await db.scalar("select count(*) from sqlite_master where name in ('b', 'c')") == 2
    with pytest.raises(ConflictError, match=r"002\.sql was applied with another text"):
        await store.database("app", migrations=[("002.sql", "create table b (y);")])


# contract: SQL-05
@pytest.mark.parametrize("open_first", [False, True])
async def test_a_migration_with_transaction_control_says_why(tmp_path: Path, open_first: bool) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        if open_first:
            await store.database("app")
        with pytest.raises(InvalidError) as info:
            await store.database("app", migrations=[("001.sql", "begin; create table t (x); commit;")])
        message = info.value.message
        assert message.startswith("database app: migration 001.sql: not allowed here: BEGIN")
        assert message.count("database app") == 1


# contract: SQL-05
async def test_a_vacuum_in_a_migration_says_to_run_it_on_its_own(store: tinystore.Store) -> None:
    # trial IS: SQLite's "cannot VACUUM from within a transaction" alone
    first = ("001.sql", "create table a (id integer primary key)")
    with pytest.raises(InvalidError) as info:
        await store.database("app", migrations=[first, ("002.sql", "vacuum;")])
    assert info.value.message == (
        "database app: migration 002.sql: VACUUM cannot run in a migration, which runs in a transaction with the "
        'migration\'s other statements: run it on its own once the migrations are applied (db.exec("vacuum"))'
    )
    db = await store.database("app", migrations=[first])  # (the first applied: what comes before is kept)
    await db.exec("vacuum")


async def test_last_insert_rowid_is_the_statements_own(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (id integer primary key, a unique);")])
    done = await db.exec("insert into t (a) values (?)", "x")
    assert done.last_insert_rowid == 1 and done.changes == 1
    # statements that insert nothing say 0, not the connection's last insert (another client's row, maybe)
    assert (await db.exec("update t set a = 'y' where id = 1")).last_insert_rowid == 0
    assert (await db.exec("create table u (b)")).last_insert_rowid == 0
    assert (await db.exec("insert or ignore into t (a) values ('y')")).last_insert_rowid == 0
    assert (await db.exec("delete from t where id = 99")).last_insert_rowid == 0
    # an insert after a comment, and one under a WITH, are inserts
    assert (await db.exec("-- a note\n/* more */ insert into t (a) values ('z')")).last_insert_rowid == 2
    done = await db.exec("with v(x) as (select 'w') insert into t (a) select x from v")
    assert done.last_insert_rowid == 3 and done.changes == 1

    async def body(tx: tinystore.SqlTx) -> list[int]:
        first = await tx.exec("insert into t (a) values ('q')")
        second = await tx.exec("update t set a = 'r' where id = 4")
        return [first.last_insert_rowid, second.last_insert_rowid]

    assert await db.tx(body) == [4, 0]


# contract: SQL-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_statement_over_the_result_limit_in_a_transaction_leaves_nothing(tmp_path: Path, mode: str) -> None:
    limits = tinystore.Limits(sql_result_bytes=10_000)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        db = await store.database("app", migrations=[("1.sql", "create table t (b blob);")])

        async def body(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values (x'00')")
            with pytest.raises(LimitError):
                await tx.exec("insert into t values (zeroblob(50000)) returning b")
            await tx.exec("insert into t values (x'01')")  # the transaction goes on

        await db.tx(body)
        assert await db.all("select hex(b) as b from t order by rowid") == [{"b": "00"}, {"b": "01"}]


async def test_read_only_transactions_nest_and_write_calls_work_inside_them(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (a);")])

    async def reader(tx: tinystore.SqlTx) -> int:
        await db.exec("insert into t values (1)")  # a read-only transaction holds no writer
        inner = await db.tx(lambda t2: t2.scalar("select count(*) from t"), read_only=True)
        assert inner == 1
        return int(await tx.scalar("select count(*) from t"))  # its own snapshot: from before the insert

    assert await db.tx(reader, read_only=True) == 0

    async def writer(tx: tinystore.SqlTx) -> int:
        await tx.exec("insert into t values (2)")
        seen = await db.tx(lambda t2: t2.scalar("select count(*) from t"), read_only=True)
        with pytest.raises(InvalidError, match="would wait for itself"):
            await db.exec("insert into t values (3)")
        return int(seen)

    assert await db.tx(writer) == 1  # the read-only one sees what was committed, not the open transaction
    assert await db.scalar("select count(*) from t") == 2


async def test_a_type_or_other_non_text_where_sql_goes_is_an_invalid_error(store: tinystore.Store) -> None:
    db = await store.database("app")
    with pytest.raises(InvalidError, match=r"scalar takes the SQL text first, not the type int \(it returns a value"):
        await db.scalar(int, "select 1")  # type: ignore[arg-type]
    # (trial CZ: it said "not type", its metaclass, and told of exec that it returns a value as SQLite gives it)
    with pytest.raises(InvalidError, match=r"exec takes the SQL text first, not the type dict \(it returns a Done"):
        await db.exec(dict, "select 1")  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="exec takes the SQL text first, not int"):
        await db.exec(5)  # type: ignore[arg-type]
    assert await db.scalar("select 1") == 1


# contract: SQL-05
async def test_a_database_whose_first_migration_fails_leaves_no_file(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(InvalidError, match=r"migration 001\.sql"):
            await store.database("fresh", migrations=[("001.sql", "create tabl oops (x);")])
        files = sorted(p.name for p in (tmp_path / "s" / "sql").iterdir())
        assert not [f for f in files if f.startswith("fresh.db")], files
        db = await store.database("fresh", migrations=[("001.sql", "create table ok (x);")])
        await db.exec("insert into ok values (1)")
        # a database that existed keeps its file when a later migration fails
        with pytest.raises(InvalidError):
            await store.database("fresh", migrations=[("001.sql", "create table ok (x);"), ("002.sql", "bad sql")])
        assert await db.scalar("select count(*) from ok") == 1


# contract: SQL-05
async def test_migrations_that_are_neither_a_folder_nor_pairs_are_an_invalid_error(store: tinystore.Store) -> None:
    for bad, words in ((42, "an int is neither"), ([("001.sql",)], "pair"), ([("001.sql", 7)], "pair")):
        with pytest.raises(InvalidError) as info:
            await store.database("app", migrations=bad)  # type: ignore[arg-type]
        assert "migrations" in info.value.message and words in info.value.message
    db = await store.database("app", migrations=[("001.sql", "create table t (a);")])
    assert await db.scalar("select count(*) from t") == 0


# contract: SQL-04
async def test_a_lone_surrogate_is_refused_naming_the_text(any_store: tinystore.Store) -> None:
    db = await any_store.database("app", migrations=[("001.sql", "create table t (v);")])
    with pytest.raises(InvalidError) as info:
        await db.exec("insert into t values (?)", "a\ud800b")
    assert "database app" in info.value.message and "'a\\ud800b'" in info.value.message
    assert "surrogate" in info.value.message
    assert await db.scalar("select count(*) from t") == 0


# contract: SQL-04
async def test_a_lone_surrogate_is_refused_naming_its_parameter_in_every_mode(any_store: tinystore.Store) -> None:
    # from trial GH: embedded, SQLite's binding refused the text without saying which parameter held it
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a, b);")])

    async def in_tx(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t values (?, ?)", 1, "x\ud800")

    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("parameter 2", lambda: db.exec("insert into t values (?, ?)", "ok", "x\ud800")),
        ("parameter 2", lambda: db.one("select ?, ?", 1, "x\udc00")),
        ("parameter 1", lambda: db.all("select ?", "x\udc00")),
        ("parameter 1", lambda: db.scalar("select ?", "x\udc00")),
        ("parameter 2", lambda: db.tx(in_tx)),
    ]
    for where, call in calls:
        with pytest.raises(InvalidError) as info:
            await call()
        assert info.value.message.startswith(f"database app: {where}: the text "), info.value.message
        assert "surrogate" in info.value.message
    assert await db.scalar("select count(*) from t") == 0


# contract: SQL-04
async def test_a_lone_surrogate_in_the_statement_is_refused_naming_the_database(any_store: tinystore.Store) -> None:
    # from trial BB: over a socket the message named neither the database nor the statement
    db = await any_store.database("app", migrations=[("001.sql", "create table t (v);")])
    tx_calls: list[Any] = []

    async def in_tx(tx: tinystore.SqlTx) -> None:
        with pytest.raises(InvalidError) as info:
            await tx.exec("insert into t values ('\ud800')")
        tx_calls.append(info.value)

    for call in (
        lambda: db.exec("insert into t values ('\ud800')"),
        lambda: db.all("select '\ud800'"),
        lambda: db.tx(in_tx),
    ):
        try:
            await call()
        except InvalidError as exc:
            tx_calls.append(exc)
    assert len(tx_calls) == 3
    for err in tx_calls:
        assert "database app" in err.message and "surrogate" in err.message, err.message
    assert await db.scalar("select count(*) from t") == 0


# contract: SQL-04
async def test_a_named_placeholder_is_refused_naming_it(any_store: tinystore.Store) -> None:
    """Parameters are ? placeholders: SQLite would bind positional values to :a/@a/$a by number, silently."""
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a, b);")])
    for sql in ("insert into t values (:a, :b)", "insert into t values (@a, ?)", "insert into t values ($a, 2)"):
        with pytest.raises(InvalidError) as info:
            await db.exec(sql, 1, 2)
        assert "named placeholder" in info.value.message and "database app" in info.value.message
    with pytest.raises(InvalidError, match=r"named placeholder :b"):
        await db.one("select * from t where a = :b", 1)
    with pytest.raises(InvalidError, match=r"named placeholder :b"):
        await db.all("select * from t where a = :b", 1)
    with pytest.raises(InvalidError, match=r"named placeholder @x"):
        await db.scalar("select @x")

    async def inside(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t values (:a, 1)", 1)

    with pytest.raises(InvalidError, match=r"named placeholder :a"):
        await db.tx(inside)
    assert await db.scalar("select count(*) from t") == 0
    # what looks like one inside strings, quoted names, comments and names is not one
    await db.exec('create table "x:y" ("a$b", c$d)')
    done = await db.exec("insert into \"x:y\" values (':a @b $c', 2) -- :d\n /* @e */ returning \"a$b\", c$d, '[:f]'")
    assert done.rows == [[":a @b $c", 2, "[:f]"]]
    assert await db.scalar("select count(*) from [x:y] where c$d = ?1 and ?1 = 2", 2) == 1


def test_the_named_placeholder_scan() -> None:
    from tinystore.engines.sql_text import named_placeholder

    assert named_placeholder("select ?") is None
    assert named_placeholder("select ?12, ?") is None
    assert named_placeholder("select 'it''s :a'") is None
    assert named_placeholder("select 'it''s', :a") == ":a"
    assert named_placeholder('select `:a`, [@b], "$c"') is None
    assert named_placeholder("select 1 -- :a") is None
    assert named_placeholder("select 1 /* :a") is None
    assert named_placeholder("select x$y from t") is None
    assert named_placeholder("select $y") == "$y"
    assert named_placeholder("select :a1_b") == ":a1_b"
    assert named_placeholder("select :") is None
    assert named_placeholder("select #a") == "#a"  # SQLite takes # too
    assert named_placeholder("select :€") == ":€" and named_placeholder("select @😀x") == "@😀x"  # names past ASCII
    assert named_placeholder("select 1 as €$x") is None  # "$" inside a name that starts past ASCII
    assert named_placeholder("select json_extract(v, '$.a.b') from t") is None
    assert named_placeholder("select 'open :a") is None  # a string left open: SQLite's error, not ours
    big = "insert into t values " + ",".join("(1, 'a:b $c', x'00', 12.5e3)" for _ in range(20_000))
    assert named_placeholder(big) is None and named_placeholder(big + ", (:last)") == ":last"


# contract: SQL-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
@pytest.mark.parametrize("open_first", [False, True])
async def test_a_new_migration_that_sorts_before_an_applied_one_is_refused(
    tmp_path: Path, mode: str, open_first: bool
) -> None:
    # from trial AM: after 001 and 003, a 002 (the merge of two branches) was applied after 003, out of name order
    m = [("001_log.sql", "create table log (n text);"), ("003_c.sql", "insert into log values ('003');")]
    late = [("002_b.sql", "insert into log values ('002');"), ("004_d.sql", "insert into log values ('004');")]
    async with open_store(mode, tmp_path / "s") as store:
        await store.database("app", migrations=m)
    async with open_store(mode, tmp_path / "s") as store:
        if open_first:
            await store.database("app", migrations=m)
        with pytest.raises(ConflictError, match=r"migration 002_b\.sql is new but sorts before 003_c\.sql"):
            await store.database("app", migrations=m + late)
        db = await store.database("app", migrations=m)  # nothing of the refused set applied, not even 004
        assert [r["n"] for r in await db.all("select n from log order by rowid")] == ["003"]
        await store.database("app", migrations=m + late[1:])
        assert [r["n"] for r in await db.all("select n from log order by rowid")] == ["003", "004"]


# contract: SQL-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_texts_are_compared_as_sqlite_reads_them(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trial GA: a no-break space is a letter of a name to SQLite, not a blank; comment-only texts are not renames;
    # line ends inside a quoted text are no change (as for an applied migration's own text)
    m = [
        ("001_init.sql", "create table tags (name text);"),
        ("002_col.sql", "alter table tags add column x\u00a0y text;"),
        ("003_note.sql", "-- nothing yet"),
        ("004_seed.sql", "insert into tags (name) values ('a\nb');"),
    ]
    async with open_store(mode, tmp_path / "s") as store:
        await store.database("app", migrations=m)
        new = [m[0], ("005_col.sql", "alter table tags add column x y;"), ("006_note.sql", "-- placeholder\n")]
        db = await store.database("app", migrations=new)
        columns = [r["name"] for r in await db.all("select name from pragma_table_info('tags')")]
        assert columns == ["name", "x\u00a0y", "x"]
        with pytest.raises(ConflictError, match=r"007_seed\.sql is new but has the text of 004_seed\.sql"):
            await store.database(
                "app", migrations=[*new, ("007_seed.sql", "insert into tags (name) values ('a\r\nb')")]
            )
        # all applied ones given, or none new: no text is read again (trial GA: seconds at each open, on the loop)
        from tinystore.engines import sql_errors

        def never(text: str) -> str:
            raise AssertionError("read again")

        monkeypatch.setattr(sql_errors, "_words", never)
        await store.database("app", migrations=new)
        await store.database("app", migrations=[*m, *new[1:], ("008_more.sql", "select 1")])


# contract: SQL-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
@pytest.mark.parametrize("open_first", [False, True])
async def test_an_applied_migration_renamed_is_refused_not_run_again(
    tmp_path: Path, mode: str, open_first: bool
) -> None:
    # trial FV: 002_seed.sql renamed 003_seed_tags.sql ran again under its new name, its row twice
    m = [
        ("001_init.sql", "create table tags (name text);\n"),
        ("002_seed.sql", "insert into tags values ('seeded');\n"),
    ]
    async with open_store(mode, tmp_path / "s") as store:
        await store.database("app", migrations=m)
    renamed = [m[0], ("003_seed_tags.sql", "insert into tags values ('seeded');\r\n")]
    async with open_store(mode, tmp_path / "s") as store:
        if open_first:
            await store.database("app", migrations=m)
        with pytest.raises(
            ConflictError, match=r"003_seed_tags\.sql is new but has the text of 002_seed\.sql.*renamed"
        ):
            await store.database("app", migrations=renamed)
        # renamed to a name that sorts before it (trial IH: told "new but sorts before ... out of order")
        with pytest.raises(ConflictError, match=r"001_seed\.sql is new but has the text of 002_seed\.sql.*renamed"):
            await store.database("app", migrations=[m[0], ("001_seed.sql", m[1][1])])
        # renamed with its blanks changed too (trial FW: a newline added, it ran again)
        with pytest.raises(ConflictError, match=r"has the text of 002_seed\.sql"):
            await store.database("app", migrations=[m[0], ("004_seed.sql", "  insert into tags\tvalues ('seeded');")])
        # renamed with its header comment edited, its case or its last ';' changed, or a byte order mark added
        # (trial FX: each ran again)
        for text in (
            "-- 005_seed.sql\ninsert into tags values ('seeded');",
            "INSERT INTO tags VALUES ('seeded') /* seed */",
            "\ufeffinsert into tags values('seeded');;",
        ):
            with pytest.raises(ConflictError, match=r"has the text of 002_seed\.sql"):
                await store.database("app", migrations=[m[0], ("005_seed.sql", text)])
        db = await store.database("app", migrations=m)
        assert await db.scalar("select count(*) from tags") == 1
        # what is quoted is kept as it is: other data is a new migration (trial FX: 'a  b' was taken for 'a b')
        others = [
            ("005_other.sql", "insert into tags values ('seeded ');"),
            ("006_other.sql", "insert into tags values ('Seeded');"),
        ]
        await store.database("app", migrations=[m[0], *others])
        assert sorted(r["name"] for r in await db.all("select name from tags")) == ["Seeded", "seeded", "seeded "]
        await db.exec("delete from tags where name <> 'seeded'")
        # the same text given twice on purpose, both files there, runs twice (a fix run again)
        await store.database("app", migrations=[*m, *others, ("007_again.sql", m[1][1])])
        assert await db.scalar("select count(*) from tags") == 2


def test_migration_texts_as_sqlite_reads_them() -> None:
    from tinystore.engines.sql_errors import _words

    assert _words(";;\nSELECT  1 ;;") == _words("select 1") == "select 1"
    assert _words("select 'A  b'") != _words("select 'a b'")
    # a text of MBs is read a window at a time (trial GC: read in one call, it held the event loop seconds), and
    # read as a short one is (trial GG: over 256 KiB, only blanks were taken out, and a rename with a comment
    # added, its keywords in capitals or a ";" added ran again)
    from tinystore.engines.sql_errors import check_migration_renames

    def renamed(old: str, new: str) -> bool:
        try:
            check_migration_renames("app", {"001": old}, [("002", new)])
        except ConflictError:
            return True
        return False

    big = "insert into t values (1);\n" * 20_000
    assert renamed(big, big.replace("\n", "\r\n  ")) and renamed(big, big.replace(",", ", "))
    assert renamed(big, big.upper()) and renamed(big, "-- renamed\n" + big) and renamed(big, big + ";")
    assert not renamed(big, big.replace("(1)", "(2)", 1))
    lit = "insert into t values ('" + "a  b " * 100_000 + "');"  # one literal over many windows
    assert renamed(lit, "/* moved */\n" + lit) and not renamed(lit, lit.replace("a  b", "a b", 1))
    assert not renamed("insert into t values ('a  b')", "insert into t values ('a b')")
    # a number is one token: 1.e5 is 100000.0, and 1. e5 is 1.0 named e5 (trial GG)
    assert not renamed("insert into t select 1.e5", "insert into t select 1. e5")
    assert not renamed("insert into t select .5e1", "insert into t select . 5e1")
    assert renamed("insert into t select 1.E5, t1.e5 from t1", "INSERT INTO t SELECT 1.e5 , t1 . e5 FROM t1")
    # a lone "\r" is a blank that does not end a "--" comment, as SQLite reads it (trial GL: taken for a line end,
    # a rename with a comment added ran again, and a new migration was refused); in quotes, a line end as the others
    once = "insert into t values (1); -- seeded once\rdo not run again"
    assert renamed("insert into t values (1);", once) and renamed(once, "insert into t values (1);")
    two = "insert into t values (1);\rinsert into t values (2)"
    assert renamed(two, two.replace("\r", "\n")) and renamed(two, two.replace("\r", "\r\n"))
    assert not renamed("insert into t values (1); --\rinsert into t values (2)", two)
    assert renamed("insert into t values ('a\rb')", "insert into t values ('a\nb')")
    # a blob, a hex number and a number with "_" are one token each (trial GL: x '41', a name and a text, and
    # 0 x10, 0 named x10, were taken for them)
    assert not renamed("insert into t select x'41'", "insert into t select x '41'")
    assert not renamed("insert into t select 0x10", "insert into t select 0 x10")
    assert not renamed("insert into t select 1_000", "insert into t select 1 _000")
    assert renamed("insert into t select X'4a', 0X10", "INSERT INTO t SELECT x'4A' , 0x10")
    assert not renamed("insert into t select max'a'", "insert into t select ma x'a'")
    # a plain name quoted is the name (trial GP: a rename with its names quoted, as a formatter does, ran again)
    assert renamed('insert into "Tags" ([name]) values (1)', "insert into tags (`NAME`) values (1)")
    assert not renamed('insert into t values ("a b")', "insert into t values (a b)")
    assert not renamed("insert into t values ('a')", "insert into t values (a)")


def test_a_migration_without_blanks_is_read_in_few_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    # trial GK: a window was looked for at each quoted part, over all the blankless text after it: a dump's
    # INSERT ... VALUES('v0'),('v1'),... of 2.3 MB took 32 s to be told a rename
    from tinystore.engines import sql_errors

    calls: list[int] = []
    real = sql_errors._window_end

    def counted(text: str, pos: int, size: int, beyond: int = -1) -> int:
        calls.append(pos)
        return real(text, pos, size, beyond)

    monkeypatch.setattr(sql_errors, "_window_end", counted)
    dump = "INSERT INTO t VALUES" + ",".join(f"('v{i}')" for i in range(50_000)) + ";"
    assert sql_errors._words(dump).startswith("insert into t values ( 'v0' ) , ( 'v1' )")
    assert len(calls) <= 4, len(calls)


def test_a_migration_read_a_window_at_a_time_reads_as_in_one_go() -> None:
    import random

    from tinystore.engines import sql_errors

    def whole(text: str) -> str:  # the reading of the whole text in one call of each expression
        return sql_errors._words(text, window=len(text) + 1)

    pieces = ["a", "B", "1", ".", "e", "5", " ", "\n", "\r\n", "\t", "'", "''", '"', "`", "[", "]", "--", "/*", "*/"]
    pieces += [";", "-", "/", "*", "é", "\f", "\r", "x", "X", "0x", "_", '"a"', "[b]", "`c`"]
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        for window in (1, 2, 3, 8):
            assert sql_errors._words(text, window) == whole(text), (text, window)
