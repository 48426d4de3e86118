"""``Done.rows`` (what ``returning`` gave) are lists of values in every mode, as a socket carries them."""

from __future__ import annotations

import tinystore


async def test_done_rows_are_lists_in_every_mode(any_store: tinystore.Store) -> None:
    db = await any_store.database("app")
    await db.exec("create table t (id integer primary key, a text, b blob)")
    done = await db.exec("insert into t (a, b) values ('x', x'01'), ('y', null) returning id, a, b")
    assert done.columns == ["id", "a", "b"]
    assert done.rows == [[1, "x", b"\x01"], [2, "y", None]]
    assert all(type(r) is list for r in done.rows)
    assert type(done.rows) is list

    async def in_tx(tx: tinystore.SqlTx) -> tinystore.Done:
        return await tx.exec("update t set a = a || '!' where id = 2 returning a")

    done = await db.tx(in_tx)
    assert done.rows == [["y!"]] and type(done.rows[0]) is list
    # no rows: an empty list; a select through exec gives rows too
    done = await db.exec("delete from t where id = 99")
    assert done.rows == [] and done.columns == []
    done = await db.exec("select count(*) from t")
    assert done.rows == [[2]] and type(done.rows[0]) is list
