"""What the file system refuses (the disk is full, an I/O error, a file that cannot be opened) is an
``UnavailableError`` naming why, never an ``InvalidError``: the caller's SQL is not at fault, and it may try
again later. Nothing of the refused write is kept; what was committed before stays."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.engines import sql as engine_sql
from tinystore.engines.sql_errors import sql_error
from tinystore.engines.sql_guard import statement_authorizer

from ..helpers import open_store


def _full() -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    conn.execute("pragma max_page_count = 2")
    try:
        conn.execute("create table t (v)")
        conn.executemany("insert into t values (?)", [("x" * 3000,)] * 10)
    except sqlite3.Error as exc:
        return exc
    raise AssertionError("no SQLITE_FULL")


def test_sqlite_full_is_unavailable_and_says_the_disk_is_full() -> None:
    err = sql_error("app", _full())
    assert isinstance(err, tinystore.UnavailableError), err
    assert err.message.startswith("database app: database or disk is full (SQLITE_FULL): the disk is full")


def test_a_write_on_a_reader_stays_invalid() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("pragma query_only = 1")
    with pytest.raises(sqlite3.Error) as info:
        conn.execute("create table t (v)")
    err = sql_error("app", info.value)
    assert isinstance(err, tinystore.InvalidError) and "this call reads" in err.message


def _disk_fills_after_a_few_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Database ``app``'s writer sees a disk that fills after a few rows (``max_page_count = 12``)."""
    real = engine_sql.SqlDatabase.connect

    def connect(self: Any, *, readonly: bool) -> sqlite3.Connection:
        conn = real(self, readonly=readonly)
        if self.name == "app" and not readonly:
            conn.set_authorizer(None)
            conn.execute("pragma max_page_count = 12")
            conn.set_authorizer(statement_authorizer(conn))
        return conn

    monkeypatch.setattr(engine_sql.SqlDatabase, "connect", connect)


async def test_a_full_database_refuses_writes_clearly_and_keeps_what_was_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _disk_fills_after_a_few_rows(monkeypatch)
    async with open_store("embedded", tmp_path / "store") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (v text);")])
        kept = 0
        with pytest.raises(tinystore.UnavailableError) as info:
            for _ in range(100):
                await db.exec("insert into t values (?)", "x" * 3000)
                kept += 1
        assert "the disk is full" in info.value.message and info.value.code == "unavailable"
        assert 0 < kept < 100 and await db.scalar("select count(*) from t") == kept

        async def fill(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t values (?)", "y")
            await tx.exec("insert into t values (?)", "z" * 50_000)

        with pytest.raises(tinystore.UnavailableError):
            await db.tx(fill)
        assert await db.scalar("select count(*) from t where v = 'y'") == 0  # nothing of it is kept
        other = await store.database("other", migrations=[("001.sql", "create table t (v text);")])
        await other.exec("insert into t values (?)", "x" * 3000)  # another database goes on


# contract: SQL-02
async def test_writes_a_full_disk_refused_are_logged_once_and_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Trial IA: every write failed for a full disk and the server's log said nothing, while status counted each
    as a write and a commit."""
    _disk_fills_after_a_few_rows(monkeypatch)
    caplog.set_level(logging.WARNING, logger="tinystore")
    async with open_store("embedded", tmp_path / "store") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (v text);")])
        with contextlib.suppress(tinystore.UnavailableError):
            for _ in range(100):
                await db.exec("insert into t values (?)", "x" * 3000)
        before = (await store.status())["databases"]["app"]
        for _ in range(3):
            with pytest.raises(tinystore.UnavailableError, match="the disk is full"):
                await db.exec("insert into t values (?)", "x" * 3000)
        after = (await store.status())["databases"]["app"]
        assert (after["writes"], after["commits"]) == (before["writes"], before["commits"])
    full = [r.getMessage() for r in caplog.records if "the disk is full" in r.getMessage()]
    assert len(full) == 1 and full[0].startswith("database app: "), full


@pytest.mark.parametrize("opened", [False, True])
async def test_a_migration_the_full_disk_stopped_is_unavailable_not_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: bool
) -> None:
    """A migration that failed only because the disk was full was an ``InvalidError`` (its SQL at fault) when a
    statement of it met the full disk, an ``UnavailableError`` when its COMMIT did (trial CN): a deploy that tries
    again on ``UnavailableError`` took the first for a bad migration. Both ways: at the database's open, and for a
    database already open."""
    real = engine_sql.SqlDatabase.connect

    def connect(self: Any, *, readonly: bool) -> sqlite3.Connection:
        conn = real(self, readonly=readonly)
        if self.name == "app" and not readonly:
            conn.set_authorizer(None)
            conn.execute("pragma max_page_count = 12")
            conn.set_authorizer(statement_authorizer(conn))
        return conn

    monkeypatch.setattr(engine_sql.SqlDatabase, "connect", connect)
    first = ("001.sql", "create table t (v text);")
    big = ("002.sql", "create table u as select randomblob(300000) as b;")
    async with open_store("embedded", tmp_path / "store") as store:
        if opened:
            await store.database("app", migrations=[first])
        with pytest.raises(tinystore.UnavailableError) as info:
            await store.database("app", migrations=[first, big])
        message = info.value.message
        assert message.startswith("database app: migration 002.sql: database or disk is full"), message
        assert "the disk is full" in message
        db = await store.database("app", migrations=[first])
        assert await db.scalar("select count(*) from sqlite_master where name = 'u'") == 0
