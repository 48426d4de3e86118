"""From trial HL: an add_many of 100,000 jobs held every other client of the server for 0.5 s (its rows checked, and
its committed jobs indexed, in one turn of the event loop). Both go a few thousand jobs a turn now; a cancel of a job
committed but not indexed yet waits for its index, rather than answer that no such job waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tinystore.engines import jobs as jobs_engine

from ..helpers import open_store


# contract: JOB-09
async def test_a_big_add_lets_other_calls_in_and_a_cancel_of_its_jobs_waits_for_their_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_engine, "TURN_JOBS", 100)  # (many turns, so that the test sees one mid-way)
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", dict)
        other = await q.add({"n": -1})
        index = await store._core.engines["jobs"]._queue("q")  # read only: to see the add's index under way
        jobs_db = await store.database("tinystore-jobs")
        add = asyncio.ensure_future(q.add_many([{"n": i} for i in range(20_000)]))
        answered = 0
        while not index.placing:  # its rows checked a hundred a turn, then its transaction, then its index
            assert not add.done()
            assert (await q.get(other)) is not None  # (answered inline, in this turn)
            answered += 1
            await asyncio.sleep(0)
        assert answered > 10  # (other calls were answered while it checked its rows)
        # committed, and indexed a hundred a turn: the newest job is not indexed yet
        newest = await jobs_db.scalar("select max(id) from _tinystore_jobs where queue = 'q'")
        assert newest not in index.entries
        assert await q.cancel(newest)  # it waits for the index, then cancels the job
        ids = await add
        assert len(ids) == 20_000 and ids[-1] == newest
        job = await q.get(newest)
        assert job is not None and job.state == "cancelled"
        assert not index.placing
        assert (await q.list(state="queued", limit=1000)).jobs[0].id != newest
