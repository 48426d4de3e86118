"""Input of the store's own calls, checked in the SDK and again in the server (for clients that are not the
SDK): migrations' names and texts."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store
from tinystore.protocol.messages import encode
from tinystore.protocol.sql import Migration, OpenDb
from tinystore.server import paths

from .raw import RawClient, error_of

BAD_NAMES = [
    ("", "migration '': a migration's name is 1 to 255 characters, with no control characters"),
    ("a\x00.sql", "migration 'a\\x00.sql': a migration's name is 1 to 255 characters, with no control characters"),
    ("a\n.sql", "migration 'a\\n.sql': a migration's name is 1 to 255 characters, with no control characters"),
    (
        "x" * 256,
        "migration '" + "x" * 37 + "'...: a migration's name is 1 to 255 characters, with no control "
        "characters (this one has 256)",
    ),
]


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_migration_names_and_texts_are_checked(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        for name, why in BAD_NAMES:
            with pytest.raises(tinystore.InvalidError) as info:
                await store.database("app", migrations=[(name, "create table t (a)")])
            assert info.value.message == f"database app: {why}"
        with pytest.raises(tinystore.InvalidError) as info:
            await store.database("app", migrations=[("001.sql", "create table z (a) -- \ud800")])
        assert info.value.message == (
            "database app: migration '001.sql': its text is not valid Unicode (surrogates not allowed at character "
            "22): UTF-8 cannot store it"
        )
        with pytest.raises(tinystore.InvalidError, match=r"^database app: migration '001.sql' is given twice$"):
            await store.database("app", migrations=[("001.sql", "create table t (a)")] * 2)
        # nothing was recorded; a good name of 255 characters is fine
        db = await store.database("app", migrations=[("y" * 255, "create table t (a)")])
        assert await db.all("select name from _tinystore_migrations") == [{"name": "y" * 255}]


async def test_the_server_checks_migration_names_itself(tmp_path: Path) -> None:
    d = tmp_path / "s"
    async with open_store("private", d) as store:
        raw = await RawClient.open(("unix", paths.socket_path(d)))
        try:
            await raw.hello()
            f = await raw.call(1, "sql.open", encode(OpenDb(db="app", migrations=[Migration("a\x00", "select 1")])))
            err = error_of(f)
            assert err.code == "invalid" and err.message.startswith("database app: migration 'a\\x00': ")
        finally:
            await raw.close()
        db = await store.database("app")
        assert await db.all("select name from _tinystore_migrations") == []
