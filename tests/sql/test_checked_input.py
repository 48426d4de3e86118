"""Input the SQL calls check, in every mode alike: subclasses of the plain types as parameters, what db.tx and
tx.exec take, migrations' names and texts, statements with no SQL or several, and the messages of typed rows
and timeouts."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import tinystore
from tests.helpers import open_store


class S(str):
    def __str__(self) -> str:
        return "overridden"


class I(int):  # noqa: E742 (the name the report used)
    def __index__(self) -> int:
        return 99

    def __int__(self) -> int:
        return 98


class F(float):
    def __float__(self) -> float:
        return 9.5


class B(bytes):
    def __bytes__(self) -> bytes:
        return b"overridden"


class Color(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    BIG = 7


async def test_subclasses_of_the_plain_types_are_their_base_value_in_every_mode(any_store: tinystore.Store) -> None:
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a, b, c, d, e, f, g)")])
    values = (S("hello"), I(5), F(1.5), B(b"x"), Color.RED, Size.BIG, True)
    row = await db.one("select ? as a, ? as b, ? as c, ? as d, ? as e, ? as f, ? as g", *values)
    assert row == {"a": "hello", "b": 5, "c": 1.5, "d": b"x", "e": "red", "f": 7, "g": 1}
    assert [type(v) for v in row.values()] == [str, int, float, bytes, str, int, int]
    done = await db.exec("insert into t values (?, ?, ?, ?, ?, ?, ?)", *values)
    assert done.changes == 1
    assert await db.one("select * from t") == {"a": "hello", "b": 5, "c": 1.5, "d": b"x", "e": "red", "f": 7, "g": 1}
    assert await db.scalar("select typeof(b) || typeof(c) || typeof(g) from t") == "integerrealinteger"

    async def in_tx(tx: tinystore.SqlTx) -> object:
        await tx.exec("insert into t (a, b) values (?, ?)", S("in tx"), I(6))
        return await tx.scalar("select b from t where a = ?", S("in tx"))

    assert await db.tx(in_tx) == 6
    # an int subclass still has to fit in 64 bits
    try:
        await db.one("select ?", I(1 << 64))
    except tinystore.InvalidError as exc:
        assert exc.message == f"database app: parameter 1: {1 << 64} does not fit in 64 bits"
    else:
        raise AssertionError("an int past 64 bits was taken")


async def test_only_a_real_lone_surrogate_is_called_one(remote_store: tinystore.Store) -> None:
    db = await remote_store.database("app")
    try:
        await db.one("select ?", "ok\ud800")
    except tinystore.InvalidError as exc:
        assert "parameter 1" in exc.message and "lone surrogate" in exc.message
    else:
        raise AssertionError("a lone surrogate was sent")


async def _invalid(call: Awaitable[Any]) -> str:
    try:
        await call
    except tinystore.InvalidError as exc:
        return exc.message
    raise AssertionError("no InvalidError")


async def test_what_db_tx_and_tx_calls_take_is_checked_in_every_mode(any_store: tinystore.Store) -> None:
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a)")])
    message = await _invalid(db.tx(None))  # type: ignore[call-overload]
    assert message == (
        "database app: tx takes fn, a function it calls with the transaction (fn(tx)); None is not callable"
    )
    # a function that takes no transaction: the call itself fails, which is said so (and nothing is kept)
    message = await _invalid(db.tx(lambda: 1))  # type: ignore[arg-type, misc]
    assert message.startswith("database app: tx calls fn with the transaction (fn(tx)), and ")
    assert "takes 0 positional arguments but 1 was given" in message
    for bad in ("yes", None, 1):
        message = await _invalid(db.tx(lambda tx: 1, read_only=bad))  # type: ignore[call-overload]
        assert message == f"database app: tx: read_only is True or False, not {'an' if bad == 1 else 'a'} " + (
            type(bad).__name__
        )

    # a TypeError raised inside fn is fn's own, and rolls back
    async def raises(tx: tinystore.SqlTx) -> None:
        await tx.exec("insert into t values (1)")
        raise TypeError("mine")

    try:
        await db.tx(raises)
    except TypeError as exc:
        assert str(exc) == "mine"
    assert await db.scalar("select count(*) from t") == 0

    async def bad_calls(tx: tinystore.SqlTx) -> list[str]:
        out = [
            await _invalid(tx.exec(None)),  # type: ignore[arg-type]
            await _invalid(tx.exec(b"select 1")),  # type: ignore[arg-type]
            await _invalid(tx.one(None)),  # type: ignore[call-overload]
            await _invalid(tx.all(b"select 1")),  # type: ignore[call-overload]
            await _invalid(tx.scalar(None)),  # type: ignore[arg-type]
        ]
        await tx.exec("insert into t values (2)")  # the transaction goes on
        return out

    assert await db.tx(bad_calls) == [
        "database app: tx.exec takes the SQL text first, not NoneType",
        "database app: tx.exec takes the SQL text first, not bytes",
        "database app: one takes the SQL text first, or a type and then the SQL text; None is not a type (a "
        "dataclass, msgspec Struct, TypedDict, ...) nor SQL text",
        "database app: all takes the SQL text first, or a type and then the SQL text; b'select 1' is not a type (a "
        "dataclass, msgspec Struct, TypedDict, ...) nor SQL text",
        "database app: scalar takes the SQL text first, not NoneType",
    ]
    assert await db.scalar("select count(*) from t") == 1


@dataclasses.dataclass
class Other:
    x: str


async def test_typed_rows_name_the_database_and_a_value_that_is_no_type(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        message = await _invalid(db.one(Other, "select 1 as x"))
        assert message == "database app: a row does not fit Other: Expected `str`, got `int` - at `$.x` (columns: x)"
        message = await _invalid(db.all(5, "select 1"))  # type: ignore[call-overload]
        assert message == (
            "database app: all takes the SQL text first, or a type and then the SQL text; 5 is not a type (a "
            "dataclass, msgspec Struct, TypedDict, ...) nor SQL text"
        )
        # typing forms are types
        assert await db.one(Other | None, "select 'a' as x") == Other("a")  # type: ignore[arg-type]
        assert await db.all(dict[str, int], "select 1 as x") == [{"x": 1}]


async def test_a_call_with_no_statement_or_several_says_so_in_every_mode(any_store: tinystore.Store) -> None:
    db = await any_store.database("app", migrations=[("001.sql", "create table t (a)")])
    for sql in ("", ";", "-- c", " /* x */ ; ;\n-- y"):
        want = f"database app: no statement: the SQL text {sql!r} holds only blanks, comments or semicolons"
        for call in (db.exec(sql), db.one(sql), db.all(sql), db.scalar(sql)):
            assert await _invalid(call) == want
    two = "database app: the SQL text holds more than one statement (or an empty one after it: ';;'), and a call "
    message = await _invalid(db.exec("insert into t values (1); insert into t values (2)"))
    assert message.startswith(two) and "db.tx" in message
    assert message == await _invalid(db.one("select 1; select 2"))
    assert message == await _invalid(db.one("select 1;;"))  # (as Python's sqlite3 counts it; trial CR)

    async def fn(tx: tinystore.SqlTx) -> None:
        assert (await _invalid(tx.exec("-- nothing"))).startswith("database app: no statement: ")
        assert (await _invalid(tx.one(";"))).startswith("database app: no statement: ")
        await tx.exec("insert into t values (3)")  # the transaction goes on

    await db.tx(fn)
    assert await db.all("select a from t") == [{"a": 3}]
    # a statement with a trailing semicolon or comment is one statement; one that gives nothing back is fine
    assert (await db.exec("insert into t values (4); -- done")).changes == 1
    assert (await db.exec("create table u (b)")).changes == 0
    assert await db.scalar("select count(*) from t;") == 2
