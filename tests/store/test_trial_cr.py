"""Trial CR (SQL and the command line, from the documentation only): a directory whose path is not UTF-8, a command
that owns the directory while others open it, migration folders read as they are, the store's own database and
VACUUM, and a backup's text output."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

import tinystore

from ..cli.support import popen_cli, run_cli
from ..helpers import ServerProcess, open_store, stop_sidecar


def _not_utf8(tmp_path: Path) -> Path:
    return Path(os.fsdecode(os.fsencode(tmp_path) + b"/store-\xff"))


# contract: STORE-04
@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_a_directory_whose_path_is_not_utf8_is_answered(tmp_path: Path, mode: str) -> None:
    # answers naming the path (sql.open's, status's) could not be encoded, and went unanswered: every call waited
    directory = _not_utf8(tmp_path)
    async with open_store(mode, directory) as store:
        db = await asyncio.wait_for(store.database("app"), 10)
        assert await db.scalar("select 1") == 1
        status = await asyncio.wait_for(store.status(), 10)
        assert status["directory"].endswith("store-\\udcff")  # (escaped: the wire carries UTF-8 text)


# contract: STORE-04
def test_the_command_line_reaches_a_server_whose_path_is_not_utf8(tmp_path: Path) -> None:
    directory = _not_utf8(tmp_path)
    server = ServerProcess(directory).start()
    try:
        done = run_cli("status", str(directory), "--json", timeout=30)
        assert done.returncode == 0, done.stderr
        done = run_cli("sql", str(directory), "--write", "--create", "select 1 as one", "--json", timeout=30)
        assert done.returncode == 0 and '"one": 1' in done.stdout, done.stderr
    finally:
        server.stop()


def _long_query(directory: Path) -> Any:
    # a command that opens the store itself (no server runs) and holds it for a second or two (a command waits 10 s)
    sql = "with recursive c(i) as (select 1 union all select i + 1 from c where i < 3000000) select count(*) from c"
    return popen_cli("sql", str(directory), sql, stdout=subprocess.DEVNULL)


async def _owned(directory: Path, pid: int) -> None:
    for _ in range(500):
        if (directory / "LOCK").read_text().strip() == str(pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the command did not take the directory")


async def test_others_wait_for_a_command_that_opened_the_store_itself(tmp_path: Path) -> None:
    # `tinystore sql` while no server ran owned the directory: another command failed at once, saying it was most
    # likely starting; an application's open() failed, told to open it "there" with serve=True
    directory = tmp_path / "s"
    async with open_store("embedded", directory) as store:
        await (await store.database("main")).exec("create table t (x)")
    query = _long_query(directory)
    try:
        await _owned(directory, query.pid)
        with pytest.raises(tinystore.InUseError) as raised:
            await tinystore.open(directory, embedded=True)
        assert f"owned by the command `tinystore sql` (pid {query.pid})" in raised.value.message
        assert "serve=True" not in raised.value.message
        started = time.monotonic()
        store = await tinystore.open(directory)  # waits for the command to end, then starts a sidecar
        try:
            assert query.poll() is not None  # (it had ended)
            assert store.mode == "sidecar" and time.monotonic() - started < 30
            assert await (await store.database("main")).scalar("select count(*) from t") == 0
        finally:
            await store.close()
            await stop_sidecar(directory)
    finally:
        query.kill()
        query.wait()


# contract: STORE-01
async def test_serve_waits_for_a_command_that_opened_the_store_itself(tmp_path: Path) -> None:
    # trial IT: a health check's `tinystore status`, run as the service started, made its `serve` fail at once
    directory = tmp_path / "s"
    async with open_store("embedded", directory) as store:
        await (await store.database("main")).exec("create table t (x)")
    query = _long_query(directory)
    try:
        await _owned(directory, query.pid)
        server = ServerProcess(directory).start(timeout=30)
        try:
            # (it let go of the store: the server waited for it, rather than fail)
            assert "the command tinystore sql owns it: waiting for it to end" in (directory / "serve.log").read_text()
        finally:
            server.stop()
    finally:
        query.kill()
        query.wait()


def test_a_command_waits_for_another_that_opened_the_store_itself(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    assert run_cli("sql", str(directory), "--write", "--create", "create table t (x)").returncode != 0  # no store
    ServerProcess(directory).start().stop()
    assert run_cli("sql", str(directory), "--write", "--create", "create table t (x)").returncode == 0
    query = _long_query(directory)
    try:
        deadline = time.monotonic() + 5
        while (directory / "LOCK").read_text().strip() != str(query.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        done = run_cli("sql", str(directory), "select count(*) as n from t", "--json", timeout=60)
        assert done.returncode == 0, done.stderr
        assert '"n": 0' in done.stdout
    finally:
        query.kill()
        query.wait()


# contract: SQL-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_null_character_in_a_migration_is_an_invalid_error(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        with pytest.raises(tinystore.InvalidError) as raised:
            await store.database("app", migrations=[("001.sql", "create table t (x); insert into t values ('\x00');")])
        assert raised.value.message.startswith("database app: migration '001.sql': its text contains a null character")
        db = await store.database("app")  # nothing applied
        assert await db.scalar("select count(*) from sqlite_master where name = 't'") == 0


# contract: SQL-05
async def test_a_migration_folder_is_read_as_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "001.sql").write_bytes(b"create table a (x);\r\ninsert into a values ('line1\r\nline2');\r\n")
    (folder / "002_b.SQL").write_bytes(b"create table b (y);\n")  # (skipped, silently)
    (folder / "notes.txt").write_text("not a migration")
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app", migrations=folder)
        assert await db.scalar("select x from a") == "line1\r\nline2"  # (the \r was dropped from the data)
        assert await db.scalar("select count(*) from b") == 0
        # the same text given as a pair is the same migration (it was "applied with another text")
        text = (folder / "001.sql").read_bytes().decode()
        await store.database("app", migrations=[("001.sql", text), ("002_b.SQL", "create table b (y);\n")])
        with pytest.raises(tinystore.InvalidError, match=r"an empty path is no folder of \.sql files"):
            await store.database("app", migrations="")
        os.mkfifo(folder / "003.sql")  # (its read blocked the event loop for ever)
        with pytest.raises(tinystore.InvalidError, match=r"003.sql is not a file \(a folder, a FIFO or a device\)"):
            await asyncio.wait_for(store.database("app", migrations=folder), 10)


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_vacuum_and_a_checkpoint_of_the_stores_own_database_are_refused_as_reads_and_run_by_exec(
    tmp_path: Path, mode: str
) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        await store.queue("work").add(1)
        jobs = await store.database("tinystore-jobs")
        for sql in ("vacuum", "pragma wal_checkpoint", "pragma wal_checkpoint(truncate)"):
            # (a read first: then an exec's VACUUM said "cannot VACUUM from within a transaction", and the read
            # itself told to use db.exec)
            for call in (jobs.all, jobs.one):
                with pytest.raises(tinystore.PermissionDeniedError, match="database tinystore-jobs is the store's own"):
                    await call(sql)
            # through exec, an admin's runs on the writer: it changes no row (trial HL: the file kept a spike's pages)
            await jobs.exec(sql)
            await jobs.exec(sql)
        assert await jobs.scalar("select count(*) from _tinystore_jobs") == 1


def test_a_backup_names_a_skipped_file_by_its_name(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    with sqlite3.connect(directory / "sql" / "App.db") as conn:
        conn.execute("create table t (x)")
    done = run_cli("backup", str(directory), str(tmp_path / "copy"))
    assert done.returncode == 0, done.stderr
    assert "not copied: sql/App.db: its name is no database name" in " ".join(done.stderr.split())


class _Strict(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    the_a: int


# contract: SQL-04
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_columns_a_strict_struct_does_not_name_are_ignored(tmp_path: Path, mode: str) -> None:
    # "Columns the type does not name are ignored": a Struct made with forbid_unknown_fields=True raised on them
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app")
        assert await db.all(_Strict, "select 1 as theA, 2 as other") == [_Strict(the_a=1)]
        assert await db.one(_Strict, "select 3 as theA, 'x' as other") == _Strict(the_a=3)
        with pytest.raises(tinystore.InvalidError, match="a row does not fit _Strict"):
            await db.all(_Strict, "select 2 as other")


async def test_a_command_run_with_interpreter_options_is_known_as_a_command(tmp_path: Path) -> None:
    # (trial CT) `python -u -m tinystore sql …` was no command: a second one failed at once, "most likely starting"
    from tinystore.server.dirlock import owned_by_command

    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    assert run_cli("sql", str(directory), "--write", "--create", "create table t (x)").returncode == 0
    sql = "with recursive c(i) as (select 1 union all select i + 1 from c where i < 3000000) select count(*) from c"
    argv = [sys.executable, "-u", "-X", "dev", "-m", "tinystore", "sql", str(directory), sql]
    query = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await _owned(directory, query.pid)
        assert owned_by_command(directory) == "sql"
    finally:
        query.kill()
        query.wait()


async def test_a_vacuum_read_in_a_busy_turn_is_told_what_it_is(tmp_path: Path) -> None:
    # a read of VACUUM after another read of the same loop turn (which share one snapshot) said "cannot VACUUM from
    # within a transaction"; alone, that only the writer runs it (db.exec)
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        got = await asyncio.gather(db.all("select 1"), db.all("vacuum"), db.one("vacuum"), return_exceptions=True)
        assert got[0] == [{"1": 1}]
        for err in got[1:]:
            assert isinstance(err, tinystore.InvalidError), err
            assert "VACUUM writes: it runs alone on the writer" in err.message, err
