"""A stuck job is reported once (JOB-11), also when the server that reported it is followed by another while the
attempt runs on: the next server knew nothing of the report and made it again."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tinystore

from ..helpers import open_store
from .util import wait_state, wait_until

START = datetime(2031, 3, 1, 9, tzinfo=UTC)


async def _stuck_reports(store: tinystore.Store) -> int:
    reports: int = (await store.status())["jobs"]["stuck_reports"]
    return reports


# contract: JOB-11
async def test_a_stuck_job_is_not_reported_again_by_the_next_server(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "s", clock=START, reconnect_timeout=30) as store:
        q = store.queue("slow", expected="30s", timeout="2h", lease="1h")
        started = asyncio.Event()
        release = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> str:
            started.set()
            await release.wait()
            return "done"

        jid = await q.add({})
        worker = q.work(handler)
        try:
            await asyncio.wait_for(started.wait(), 10)
            await store.clock.advance("31s")
            await wait_until(lambda: _stuck_reports(store), what="the stuck report")
            first = (await store.status())["pid"]
            # the server dies; the SDK starts another (its clock where this process left it), which loads the
            # attempt still running: reported stuck already, it is not reported again
            os.kill(first, signal.SIGKILL)

            async def back() -> bool:
                try:
                    return bool((await store.status())["pid"] != first)
                except tinystore.UnavailableError:
                    return False

            await wait_until(back, timeout=20, what="the next server")
            await store.clock.advance("1m")
            await asyncio.sleep(0.3)
            assert await _stuck_reports(store) == 0
            assert [j.id for j in (await q.list(state="stuck")).jobs] == [jid]  # (it still shows as stuck)
            release.set()
            await wait_state(q, jid, "succeeded")
        finally:
            release.set()
            await worker.stop()


# contract: JOB-11
async def test_a_jobs_table_made_before_the_stuck_column_gets_it(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    async with open_store("embedded", directory, clock=START) as store:
        await store.queue("old", expected="30s", timeout="2h").add({})
    path = directory / "sql" / "tinystore-jobs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("alter table _tinystore_jobs drop column stuck_fence")
    conn.close()
    async with open_store("embedded", directory, clock=START) as store:
        q = store.queue("old", expected="30s", timeout="2h")
        started = asyncio.Event()
        release = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.set()
            await release.wait()

        worker = q.work(handler)
        try:
            await asyncio.wait_for(started.wait(), 10)
            await store.clock.advance("31s")
            await wait_until(lambda: _stuck_reports(store), what="the stuck report")
            assert len((await q.list(state="stuck")).jobs) == 1
        finally:
            release.set()
            await worker.stop()
    with sqlite3.connect(path) as conn:
        assert conn.execute("select stuck_fence = fence from _tinystore_jobs").fetchall() == [(1,)]
    conn.close()
