"""Trial HZ (a veteran of sqlite3 and SQLAlchemy): ``:name`` placeholders were refused; they take their values by
name from one dict, as Python's sqlite3 binds them, in every way of reaching the store."""

from __future__ import annotations

import enum
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError


class Colour(enum.IntEnum):
    RED = 1


# contract: SQL-04
# contract: SQL-06
async def test_named_placeholders_take_their_values_from_one_dict(any_store: tinystore.Store) -> None:
    db = await any_store.database("app", migrations=[("001.sql", "create table t (id integer primary key, a, b);")])
    done = await db.exec("insert into t (a, b) values (:a, @b) returning id", {"a": 1, "b": "x"})
    assert done.rows == [[1]]
    await db.exec("insert into t (a, b) values ($a, :a)", {"a": b"\x00\xff"})
    assert await db.one("select a, b from t where id = :id", {"id": 1}) == {"a": 1, "b": "x"}
    assert await db.all("select a, b from t where a = :a and b = :a", {"a": b"\x00\xff"}) == [
        {"a": b"\x00\xff", "b": b"\x00\xff"}
    ]
    assert await db.scalar("select count(*) from t where id >= :low", {"low": 1}) == 2
    # values as a positional parameter takes them: an IntEnum's member is its int, a bool 1
    assert await db.scalar("select :v + :w", {"v": Colour.RED, "w": True}) == 2
    # a mapping other than a dict, and extra names, as sqlite3 takes them
    from types import MappingProxyType

    assert await db.scalar("select :v", MappingProxyType({"v": 7, "unused": 8})) == 7

    async def inside(tx: tinystore.SqlTx) -> object:
        await tx.exec("insert into t (a, b) values (:a, :b)", {"a": 3, "b": None})
        return await tx.one("select a, b from t where a = :a", {"a": 3})

    assert await db.tx(inside) == {"a": 3, "b": None}

    # what is wrong is named, and nothing is written, and the session goes on
    with pytest.raises(InvalidError, match=r"database app: .*binding parameter :b"):
        await db.exec("insert into t (a, b) values (:a, :b)", {"a": 9})
    with pytest.raises(InvalidError, match=r"database app: parameter :a: a list is not a SQL value"):
        await db.exec("insert into t (a) values (:a)", {"a": [1]})
    with pytest.raises(InvalidError, match=r"database app: parameter :a: .* does not fit in 64 bits"):
        await db.exec("insert into t (a) values (:a)", {"a": 1 << 64})
    with pytest.raises(InvalidError, match=r"database app: parameter name 1: an int; names are text"):
        await db.exec("insert into t (a) values (:a)", {1: 2})
    with pytest.raises(InvalidError, match=r"database app: Binding 1 has no name"):
        await db.exec("insert into t (a) values (?)", {"a": 9})
    with pytest.raises(InvalidError, match=r"named placeholder :a: give its values by name in one dict"):
        await db.exec("insert into t (a) values (:a)", 9)
    with pytest.raises(InvalidError, match=r"parameter 2: a dict is not a SQL value .*values by name come in one dict"):
        await db.exec("insert into t (a, b) values (?, ?)", 9, {"a": 9})
    with pytest.raises(InvalidError, match=r"the dict of its values by name is the only parameter .*2 were given"):
        await db.one("select :a", {"a": 1}, 2)  # (trial IC: it was told to give a dict)
    assert await db.scalar("select count(*) from t") == 3


# contract: SQL-06
async def test_a_named_parameter_that_is_no_valid_text_is_named(any_store: tinystore.Store) -> None:
    """Trial IE: a lone surrogate in a named parameter was "parameter 1: dict cannot be sent" (embedded) or "a value
    cannot be sent" naming neither the database nor the parameter (over a socket)."""
    db = await any_store.database("app")
    with pytest.raises(InvalidError, match=r"database app: parameter :a: the text .* is not valid Unicode"):
        await db.one("select :a as x", {"a": "\ud800"})
    with pytest.raises(InvalidError, match=r"database app: parameter :a: the text .* is not valid Unicode"):
        await db.exec("select :a", {"a": "x\udfff"})
    assert await db.one("select :a as x", {"a": "ok"}) == {"x": "ok"}  # (the connection goes on)


# contract: SQL-06
async def test_a_mapping_is_asked_for_the_names_it_does_not_list(any_store: tinystore.Store) -> None:
    """Trial IE: Python's sqlite3 asks a mapping for each placeholder's name (a defaultdict's default, a
    ``__missing__``'s value); its keys alone were taken, and the statement told a value was missing."""
    import collections

    db = await any_store.database("app")
    assert await db.one("select :a as a, :b as b", collections.defaultdict(lambda: 9, {"a": 1})) == {"a": 1, "b": 9}

    class Upper(dict[str, Any]):
        def __missing__(self, key: str) -> str:
            return key.upper()

    assert await db.one("select @x as x, $y as y, :x as x2", Upper()) == {"x": "X", "y": "Y", "x2": "X"}
    # trial IM: SQLite's variables take "::" pairs and a "(...)" suffix (TCL's) into their names, as sqlite3 asks
    assert await db.one("select $a(x) as a, @::b as b, :c::d as c", Upper()) == {"a": "A(X)", "b": "::B", "c": "C::D"}
    with pytest.raises(InvalidError, match=r"did not supply a value for binding parameter :c"):
        await db.one("select :c", collections.OrderedDict())
