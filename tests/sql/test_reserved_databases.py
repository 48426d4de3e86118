"""The store's own databases (``tinystore-…``, such as ``tinystore-jobs``): clients read them, never write them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tests.helpers import ServerProcess, write_tokens

OWN = "is the store's own"


async def check_read_only(store: tinystore.Store, admin: bool = True) -> None:
    """What a client may and may not do with ``tinystore-jobs`` (a queue with one job in it)."""
    jobs = await store.database("tinystore-jobs")
    # reads: allowed
    assert await jobs.scalar("select count(*) from _tinystore_jobs") == 1
    assert [r["name"] for r in await jobs.all("select name from _tinystore_queues")] == ["mail"]
    assert (await jobs.one("select count(*) as n from _tinystore_jobs")) == {"n": 1}
    assert await jobs.tx(lambda tx: tx.scalar("select count(*) from _tinystore_jobs"), read_only=True) == 1
    # an exec that only reads is a read
    done = await jobs.exec("select count(*) as n from _tinystore_jobs")
    assert done.changes == 0 and done.columns == ["n"] and [list(r) for r in done.rows] == [[1]]
    # writes: refused, naming the database and why
    for sql in (
        "delete from _tinystore_jobs",
        "drop table _tinystore_queues",
        "update _tinystore_jobs set state = 'dead'",
        "create table mine (a)",
        "delete from _tinystore_jobs returning id",
    ):
        with pytest.raises(tinystore.PermissionDeniedError, match=f"database tinystore-jobs {OWN}") as err:
            await jobs.exec(sql)
        assert "jobs API" in err.value.message
    # a read cannot be made into a write either (the readers' pragma query_only stays on)
    with pytest.raises(tinystore.InvalidError, match="query_only"):
        await jobs.one("pragma query_only = 0")
    with pytest.raises(tinystore.InvalidError, match="query_only"):
        await jobs.exec("pragma query_only = false")

    async def wipe(tx: tinystore.SqlTx) -> None:
        await tx.exec("delete from _tinystore_jobs")

    with pytest.raises(tinystore.PermissionDeniedError, match=f"database tinystore-jobs {OWN}.*read_only=True"):
        await jobs.tx(wipe)
    with pytest.raises(tinystore.InvalidError, match="read-only transaction"):
        await jobs.tx(wipe, read_only=True)
    with pytest.raises(tinystore.PermissionDeniedError, match=f"database tinystore-jobs {OWN}.*migrations"):
        await store.database("tinystore-jobs", migrations=[("001.sql", "create table mine (a);")])
    # another reserved name: not made by a client
    with pytest.raises(tinystore.PermissionDeniedError, match=f"database tinystore-mine {OWN}.*may not create"):
        await store.database("tinystore-mine")
    # nothing changed, and the jobs go on
    assert await jobs.scalar("select count(*) from _tinystore_jobs") == 1
    assert await jobs.scalar("select count(*) from sqlite_master where name = 'mine'") == 0
    q = store.queue("mail")
    await q.add({"to": "b@x"})
    assert await jobs.scalar("select count(*) from _tinystore_jobs") == 2
    got: list[Any] = []

    async def handler(value: Any, run: tinystore.Run) -> None:
        got.append(value)

    assert await q.run_due(handler) == 2
    assert sorted(v["to"] for v in got) == ["a@x", "b@x"]
    # a database of the user's is as before: pragma query_only is the store's, other pragmas are not (but those that
    # set what migrations own, for a data token: trial FC)
    app = await store.database("app")
    if admin:
        await app.exec("pragma user_version = 7")
        assert await app.scalar("pragma user_version") == 7
    else:
        with pytest.raises(tinystore.PermissionDeniedError, match="need the admin capability"):
            await app.exec("pragma user_version = 7")
        assert await app.scalar("pragma user_version") == 0


async def test_reserved_databases_are_read_only(any_store: tinystore.Store) -> None:
    await any_store.queue("mail").add({"to": "a@x"})
    await check_read_only(any_store)


async def test_a_data_token_cannot_write_the_jobs_database(tmp_path: Path) -> None:
    tokens, admin, data = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "store", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        boss = await tinystore.connect(server.tcp, token=admin)
        await boss.database("app")  # a data token opens databases, the admin makes them
        await boss.close()
        store = await tinystore.connect(server.tcp, token=data)
        try:
            await store.queue("mail").add({"to": "a@x"})
            await check_read_only(store, admin=False)
            # trial HF: a data token's PRAGMAs that rebuild or set what migrations own ran here (on a reader, to no
            # effect) where the same words through db.all were refused: refused alike, as writes
            jobs = await store.database("tinystore-jobs")
            kept = await jobs.scalar("select count(*) from _tinystore_jobs")
            for sql in ("pragma optimize", "pragma page_size = 1024", "pragma auto_vacuum = 2", "analyze", "vacuum"):
                with pytest.raises(tinystore.PermissionDeniedError, match=f"database tinystore-jobs {OWN}"):
                    await jobs.exec(sql)
            assert await jobs.scalar("select count(*) from _tinystore_jobs") == kept
        finally:
            await store.close()
    finally:
        server.stop()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tinystore", *args], capture_output=True, text=True, timeout=60, check=False
    )


async def test_the_cli_reads_the_jobs_database_and_cannot_write_it(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        await store.queue("mail").add({"to": "a@x"})
    finally:
        await store.close()
    read = await asyncio.to_thread(
        run_cli, "sql", str(directory), "--db", "tinystore-jobs", "--json", "select count(*) as n from _tinystore_jobs"
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == '{"n": 1}'
    for extra in ([], ["--write"]):
        wrote = await asyncio.to_thread(
            run_cli, "sql", str(directory), "--db", "tinystore-jobs", *extra, "delete from _tinystore_jobs"
        )
        assert wrote.returncode == 1
        assert wrote.stderr.startswith(f"error[permission_denied] database tinystore-jobs {OWN}"), wrote.stderr
    # trial HL: VACUUM changes no row, and nothing else could give back the file's free pages after a spike of jobs
    vacuumed = await asyncio.to_thread(run_cli, "sql", str(directory), "--db", "tinystore-jobs", "--write", "vacuum")
    assert vacuumed.returncode == 0, vacuumed.stderr
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        jobs = await store.database("tinystore-jobs")
        await jobs.exec("vacuum")
        await jobs.exec("pragma wal_checkpoint(truncate)")
        assert await jobs.scalar("select count(*) from _tinystore_jobs") == 1
    finally:
        await store.close()
    listed = await asyncio.to_thread(run_cli, "jobs", str(directory), "list", "--queue", "mail", "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"a@x"' in listed.stdout or "a@x" in listed.stdout
