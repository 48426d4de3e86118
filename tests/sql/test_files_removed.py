"""From trial AJ: a database file or its WAL removed (or renamed) while the store runs. SQLite goes on writing into
the removed file, so every write was acknowledged and lost at the next start. A commit into a database file that
is gone is now refused, naming it; a removed WAL's commits are copied into the database file before they are
acknowledged, so they survive a kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store

MIGRATION = [("1.sql", "create table t (x integer);")]


# contract: SQL-02
@pytest.mark.parametrize("mode", ["embedded", "private"])
@pytest.mark.parametrize("how", ["removed", "renamed"])
async def test_a_commit_into_a_database_file_no_longer_in_place_is_refused(tmp_path: Path, mode: str, how: str) -> None:
    directory = tmp_path / "store"
    async with open_store(mode, directory) as store:
        db = await store.database("app", migrations=MIGRATION)
        await db.exec("insert into t (x) values (1)")
        path = directory / "sql" / "app.db"
        if how == "removed":
            path.unlink()
        else:
            path.rename(path.with_name("elsewhere.db"))
        await asyncio.sleep(0.05)  # (the writer looks at its files every 10 ms at most)
        for write in (db.exec("insert into t (x) values (2)"), db.tx(lambda tx: tx.exec("insert into t values (3)"))):
            with pytest.raises(tinystore.UnavailableError, match=r"database app: its file .*app\.db was removed or"):
                await write
        try:  # a read may still see the removed file, or fail: then its error names the file too
            await db.scalar("select count(*) from t")
        except tinystore.UnavailableError as exc:
            assert f"its file {path} was removed or replaced" in exc.message, exc.message
        if how == "renamed":  # what was refused was not kept: the file put back holds none of it
            path.with_name("elsewhere.db").rename(path)
            with sqlite3.connect(path) as conn:
                assert conn.execute("select x from t").fetchall() == [(1,)]
        # the store's other databases go on
        other = await store.database("other", migrations=MIGRATION)
        await other.exec("insert into t (x) values (1)")
        assert await other.scalar("select count(*) from t") == 1


# contract: SQL-02
@pytest.mark.parametrize("how", ["removed", "made again by another program"])
async def test_commits_after_the_wal_was_replaced_survive_a_kill_9(tmp_path: Path, how: str) -> None:
    directory = tmp_path / "store"
    async with open_store("private", directory) as store:
        db = await store.database("app", migrations=MIGRATION)
        await db.exec("insert into t (x) values (0)")
        wal = directory / "sql" / "app.db-wal"
        wal.unlink()
        await asyncio.sleep(0.05)  # (the writer looks at its files every 10 ms at most: commits before are the window)
        if how != "removed":  # (any program opening the database makes its WAL again, empty)
            other = sqlite3.connect(f"file:{directory / 'sql' / 'app.db'}?mode=ro", uri=True)
            try:
                other.execute("select count(*) from t").fetchall()
            except sqlite3.Error:
                pass  # (its read may fail: the store's WAL index names frames the new, empty WAL has not)
            finally:
                other.close()
            assert wal.exists()
        for i in range(1, 21):
            await db.exec("insert into t (x) values (?)", i)

        async def body(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (x) values (21)")

        await db.tx(body)
        os.kill((await store.status())["pid"], signal.SIGKILL)
    async with open_store("private", directory) as store:
        db = await store.database("app")
        assert await db.scalar("select count(*) from t") == 22


# contract: SQL-02
async def test_a_wal_left_without_its_database_file_is_refused_not_applied_to_a_new_one(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    async with open_store("private", directory) as store:
        db = await store.database("app", migrations=MIGRATION)
        await db.exec("insert into t (x) values (1)")
        (directory / "sql" / "app.db").unlink()  # removed, then the server dies with the WAL left behind
        os.kill((await store.status())["pid"], signal.SIGKILL)
    assert (directory / "sql" / "app.db-wal").stat().st_size > 0
    async with open_store("embedded", directory) as store:
        with pytest.raises(tinystore.CorruptError, match=r"database app: its WAL file .* the database file .* is gone"):
            await store.database("app")
        assert not (directory / "sql" / "app.db").exists()  # no empty database made in its place


async def test_a_database_that_cannot_be_made_leaves_no_empty_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From trial AJ: database() on a full disk failed, naming it, and left a 0-byte NAME.db behind."""
    import sqlite3

    from tinystore.engines import sql

    def full(self: sql.SqlDatabase, *, readonly: bool) -> sqlite3.Connection:
        exc = sqlite3.OperationalError("database or disk is full")
        exc.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
        raise exc

    directory = tmp_path / "store"
    async with open_store("embedded", directory) as store:
        monkeypatch.setattr(sql.SqlDatabase, "connect", full)
        with pytest.raises(tinystore.UnavailableError, match="database new2: database or disk is full"):
            await store.database("new2")
        assert not (directory / "sql" / "new2.db").exists()
