"""Trial CY: a worker whose store will not come back ends (it claimed every 2 s for ever, and ``wait()`` never
returned); queues loading at once on a jobs table made before ``stuck_fence`` add the column once, quietly."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store


@pytest.mark.parametrize("how", ["private stopped", "sidecar moved"])
async def test_a_worker_ends_when_its_store_will_not_come_back(tmp_path: Path, how: str) -> None:
    directory = tmp_path / "s"
    mode = how.split()[0]
    async with open_store(mode, directory) as store:

        def handler(value: Any, run: tinystore.Run) -> None:
            return None

        worker = store.queue("q").work(handler)
        await store.queue("q").add({})
        await asyncio.sleep(0.3)
        if mode == "private":
            await store.stop_server()
        else:
            os.rename(directory, tmp_path / "moved")
        with pytest.raises(tinystore.UnavailableError):
            await asyncio.wait_for(worker.wait(), 20)
        if mode == "sidecar":
            os.rename(tmp_path / "moved", directory)  # (for open_store to stop its server)


# contract: JOB-11
async def test_queues_loading_at_once_on_an_older_table_add_the_column_once_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "s"
    async with open_store("embedded", directory) as store:
        for name in ("q1", "q2", "q3"):
            await store.queue(name).add({})
    with sqlite3.connect(directory / "sql" / "tinystore-jobs.db") as conn:
        conn.execute("alter table _tinystore_jobs drop column stuck_fence")
    conn.close()
    with caplog.at_level(logging.ERROR, logger="tinystore"):
        async with open_store("embedded", directory) as store:
            await asyncio.gather(*(store.queue(n).list() for n in ("q1", "q2", "q3")))
            await asyncio.sleep(0.2)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    with sqlite3.connect(directory / "sql" / "tinystore-jobs.db") as conn:
        names = [r[1] for r in conn.execute("pragma table_info(_tinystore_jobs)")]
    conn.close()
    assert names.count("stuck_fence") == 1
