"""Input the SQL calls check, in every mode alike: subclasses of the plain types as parameters, what db.tx and
tx.exec take, migrations' names and texts, statements with no SQL or several, and the messages of typed rows
and timeouts."""

from __future__ import annotations

import enum

import tinystore


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
