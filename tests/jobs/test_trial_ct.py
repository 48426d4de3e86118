"""Trial CT (breaking the session's fixes): migrations applied with other line endings, a LostError raised as a stop
cancels a handler, a test clock that runs on to the end of year 9999, a long history's end."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from .util import claim, report


# contract: SQL-05
async def test_a_store_whose_crlf_migrations_were_applied_as_lf_still_opens(tmp_path: Path) -> None:
    # the version before read a folder's files with their line endings made "\n", and recorded that text; this one
    # reads the bytes as they are: the same unchanged file was "applied with another text", and no open succeeded
    folder = tmp_path / "m"
    folder.mkdir()
    text = "create table t (x);\r\ninsert into t values (1);\r\n"
    (folder / "001_init.sql").write_bytes(text.encode())
    (folder / "002_mac.sql").write_bytes(b"create table u (y);\rinsert into u values (2);\r")  # (trial CV: "\r" alone)
    async with open_store("embedded", tmp_path / "s") as store:
        lf = [
            ("001_init.sql", text.replace("\r\n", "\n")),
            ("002_mac.sql", "create table u (y);\ninsert into u values (2);\n"),
        ]
        await store.database("app", migrations=lf)  # (as the version before recorded them)
        db = await store.database("app", migrations=folder)
        assert await db.scalar("select count(*) from t") == 1
        with pytest.raises(tinystore.ConflictError, match="was applied with another text"):
            await store.database("app", migrations=[("001_init.sql", text + "-- changed\n")])


# contract: JOB-04
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_lost_error_raised_as_a_stop_cancels_the_handler_fails_the_attempt(tmp_path: Path, mode: str) -> None:
    # it was neither reported nor handed back: embedded, the job stayed running for as long as the store was open
    async with open_store(mode, tmp_path / "s") as store:
        q = store.queue("s", attempts=3)
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.set()
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                raise tinystore.LostError("lock summaries: the lease ran out during the cleanup") from None

        worker = q.work(handler)
        jid = await q.add(1)
        await asyncio.wait_for(started.wait(), 10)
        await worker.stop(grace=0)
        job = await q.get(jid)
        assert job is not None and job.state == "failed" and job.attempts == 1, job
        assert job.errors[0].error == "LostError: lock summaries: the lease ran out during the cleanup"


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_test_clock_that_runs_on_stops_at_the_end_of_year_9999(tmp_path: Path, mode: str) -> None:
    # a test clock runs on with real time: started two seconds before the end, every add failed after them
    async with open_store(mode, tmp_path / "s", clock=datetime(9999, 12, 31, 23, 59, 59)) as store:
        q = store.queue("q")
        await asyncio.sleep(1.5)
        assert await store.clock.now() <= datetime(9999, 12, 31, 23, 59, 59, 999999).timestamp()
        jid = await q.add(2)
        job = await q.get(jid)
        assert job is not None and job.state == "queued"


# contract: JOB-04
async def test_a_full_history_of_long_errors_keeps_its_newest_50_as_attempts_end_together(tmp_path: Path) -> None:
    # jobs with 50 long errors each (some 300 KB), ending in one statement: each keeps its newest 50, in order (the
    # trim read the history once per entry: ends 25 times slower, holding the writer)
    async with open_store("embedded", tmp_path / "s", clock=datetime(2030, 1, 1)) as store:
        q = store.queue("long", attempts=100, backoff=("1s", "1s"))
        ids = [await q.add(i) for i in range(20)]
        history = [{"attempt": i, "error": "e" * 2000, "at_ms": 1, "traceback": "t" * 4000} for i in range(1, 51)]
        db_path = tmp_path / "s" / "sql" / "tinystore-jobs.db"
        with sqlite3.connect(db_path) as conn:
            conn.execute("pragma busy_timeout = 10000")
            conn.executemany(
                "update _tinystore_jobs set errors = ?, attempts = 50 where id = ?",
                [(json.dumps(history), jid) for jid in ids],
            )
        await store.clock.advance("1s")
        got = await claim(store, "long", n=20)
        assert len(got) == 20
        assert all(await asyncio.gather(*(report(store, "long", c, "error", error="late") for c in got)))
        for jid in ids:
            job = await q.get(jid)
            assert job is not None
            assert [e.attempt for e in job.errors] == list(range(2, 52)), jid
            assert job.errors[-1].error == "late"
