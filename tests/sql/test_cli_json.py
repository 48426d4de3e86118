"""``tinystore sql DIR ... --json`` prints valid JSON lines: NaN and infinities as null (the CLI's to_json)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import tinystore


async def test_sql_json_writes_non_finite_floats_as_null(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        db = await store.database("app")
        await db.exec("create table t (x real)")
        await db.exec("insert into t (x) values (1e999), (-1e999), (1.5)")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tinystore", "sql", str(directory), "--db", "app", "--json", "select x from t"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = await asyncio.to_thread(run)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines == ['{"x": null}', '{"x": null}', '{"x": 1.5}']
    assert [json.loads(line) for line in lines] == [{"x": None}, {"x": None}, {"x": 1.5}]


STATEMENT = ("select ? as a, ? as b, typeof(?) as t", "007", "1234567890123456789012345678901234567890", "1")


async def test_sql_text_sends_every_parameter_as_text(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        await store.database("app")

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tinystore", "sql", str(directory), "--db", "app", "--json", *extra, *STATEMENT],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = await asyncio.to_thread(run)  # without --text: numbers (the 40 digits do not fit in 64 bits)
    assert done.returncode == 1 and "64 bits" in done.stderr, done
    done = await asyncio.to_thread(run, "--text")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0]) == {
        "a": "007",
        "b": "1234567890123456789012345678901234567890",
        "t": "text",
    }
