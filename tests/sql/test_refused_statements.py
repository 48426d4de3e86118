"""Statements a client may not run: ATTACH/DETACH (files outside the store) and transaction control."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tinystore import InvalidError


# contract: STORE-04
async def test_attach_is_refused_and_writes_no_file(store: tinystore.Store, tmp_path: Path) -> None:
    db = await store.database("app")
    evil = tmp_path / "evil.db"
    with pytest.raises(InvalidError) as info:
        await db.exec(f"attach database '{evil}' as evil")
    assert "ATTACH" in info.value.message
    assert not evil.exists()
    with pytest.raises(InvalidError):
        await db.exec("detach database main")
    assert await db.scalar("select 1") == 1  # the session goes on


async def test_transaction_control_in_exec_is_refused(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("1.sql", "create table t (a);")])
    for stmt in ("begin", "commit", "rollback", "savepoint s"):
        with pytest.raises(InvalidError):
            await db.exec(stmt)
    await db.exec("insert into t values (1)")
    assert await db.scalar("select count(*) from t") == 1


async def test_a_row_that_does_not_fit_the_type_is_an_invalid_error(store: tinystore.Store) -> None:
    import dataclasses

    @dataclasses.dataclass
    class Msg:
        id: int
        chat_id: int

    db = await store.database("app", migrations=[("1.sql", "create table m (id integer primary key, text);")])
    await db.exec("insert into m (text) values ('x')")
    with pytest.raises(InvalidError) as info:
        await db.one(Msg, "select id, text from m")
    assert "Msg" in info.value.message and "chat_id" in info.value.message
