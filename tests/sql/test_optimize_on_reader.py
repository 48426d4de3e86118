"""PRAGMA optimize on a reader's connection (session of 2026-12-07, eighth): SQLite cannot write the statistics
there and says nothing, so a read of it answered no row, as one that worked does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import tinystore


# contract: SQL-06
@pytest.mark.parametrize("sql", ["pragma optimize", "PRAGMA main.optimize(0x10002)", "select * from pragma_optimize"])
async def test_a_read_of_pragma_optimize_is_refused_and_names_the_writer(tmp_path: Path, sql: str) -> None:
    async with await tinystore.open(tmp_path / "s", embedded=True, serve=False) as store:
        db = await store.database("app")
        await db.exec("create table t (x)")
        await db.exec("insert into t values (1)")
        with pytest.raises(tinystore.InvalidError, match=r"PRAGMA optimize writes: it runs alone on the writer"):
            await db.all(sql)
        # the session goes on, and the writer runs it
        await db.exec("pragma optimize")
        assert await db.scalar("select count(*) from t") == 1


def _sql(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tinystore", "sql", str(directory), "--db", "app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# contract: SQL-06
async def test_the_cli_says_pragma_optimize_needs_write(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        db = await store.database("app")
        await db.exec("create table t (x)")
    refused = await asyncio.to_thread(_sql, directory, "pragma optimize")
    assert refused.returncode == 1, refused
    assert "PRAGMA optimize writes" in refused.stderr and "--write" in refused.stderr, refused.stderr
    done = await asyncio.to_thread(_sql, directory, "--write", "pragma optimize")
    assert done.returncode == 0 and done.stderr == "", done.stderr
