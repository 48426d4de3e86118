"""From trial HL: an add_many of 100,000 jobs held every other client of the server for 0.5 s (its rows checked, and
its committed jobs indexed, in one turn of the event loop). Both go a few thousand jobs a turn now; a cancel of a job
committed but not indexed yet waits for its index, rather than answer that no such job waits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.engines import jobs as jobs_engine

from ..helpers import open_store


# contract: JOB-09
async def test_a_big_add_lets_other_calls_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs_engine, "TURN_JOBS", 100)  # (many turns, so that the test sees one mid-way)
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", dict)
        other = await q.add({"n": -1})
        index = await store._core.engines["jobs"]._queue("q")  # read only: to see the add's index under way
        jobs_db = await store.database("tinystore-jobs")
        add = asyncio.ensure_future(q.add_many([{"n": i} for i in range(20_000)]))
        answered = 0
        while not add.done():  # its rows checked a hundred a turn, then its transaction, then its index likewise
            assert (await q.get(other)) is not None  # (answered inline, in this turn)
            answered += 1
            await asyncio.sleep(0)
        assert answered > 100  # (other calls were answered all along)
        ids = add.result()
        assert len(ids) == 20_000 and len(set(ids)) == 20_000
        assert all(i in index.entries for i in ids) and not index.placing
        assert await jobs_db.scalar("select count(*) from _tinystore_jobs where queue = 'q'") == 20_001


# contract: JOB-09
async def test_a_cancel_between_a_big_adds_commit_and_its_index_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial HN: a job of a big add, read by SQL between the add's commit and its index, was cancelled "no such job"
    (False), and then ran. The add holds its barrier from before its commit."""
    real = jobs_engine.JobsEngine._added_in_turns

    async def late(self: jobs_engine.JobsEngine, q: Any, rows: list[list[Any]]) -> None:
        await asyncio.sleep(0.3)  # (the index comes late: the rows are committed, and read meanwhile)
        await real(self, q, rows)

    monkeypatch.setattr(jobs_engine.JobsEngine, "_added_in_turns", late)
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", dict)
        await q.add({"n": -1})
        jobs_db = await store.database("tinystore-jobs")
        add = asyncio.ensure_future(q.add_many([{"n": i} for i in range(3_000)]))
        while (n := await jobs_db.scalar("select count(*) from _tinystore_jobs where queue = 'q'")) < 3_001:
            await asyncio.sleep(0.005)
        assert n == 3_001 and not add.done()
        newest = await jobs_db.scalar("select max(id) from _tinystore_jobs where queue = 'q'")
        assert await q.cancel(newest)
        await add
        job = await q.get(newest)
        assert job is not None and job.state == "cancelled"


async def test_an_embedded_read_loop_with_no_other_await_lets_a_big_add_go_on(tmp_path: Path) -> None:
    """Trial HN: reads answered inline never let the event loop turn, so a caller that read in a loop with no other
    await held a big add (and everything else) for as long as it read."""
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", dict)
        db = await store.database("app")
        add = asyncio.ensure_future(q.add_many([{"n": i} for i in range(5_000)]))
        for _ in range(200_000):
            if add.done():
                break
            await db.scalar("select 1")
        assert add.done() and len(add.result()) == 5_000


async def test_a_vacuum_of_the_jobs_database_waits_for_no_attempt_to_run(tmp_path: Path) -> None:
    """Trial HN: a VACUUM of tinystore-jobs holds its writer for as long as it takes, and the lease renewals of the
    attempts running then waited behind it: attempts were lost, and counted. Refused while any runs."""

    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", dict)
        release, started = asyncio.Event(), asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.set()
            await release.wait()

        await q.add({"n": 1})
        jobs_db = await store.database("tinystore-jobs")
        worker = q.work(handler, concurrency=1)
        try:
            await asyncio.wait_for(started.wait(), 10)
            with pytest.raises(tinystore.InUseError, match="1 attempt\\(s\\) running now would lose their leases"):
                await jobs_db.exec("vacuum")
            await jobs_db.exec("pragma wal_checkpoint(truncate)")  # (bounded: a second at most for readers)
            release.set()
            for _ in range(500):
                if (await q.list(state="succeeded")).jobs:
                    break
                await asyncio.sleep(0.01)
            await jobs_db.exec("vacuum")
        finally:
            await worker.stop()


# contract: JOB-06
async def test_a_big_add_in_a_transaction_is_indexed_in_turns_after_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that added 100,000 jobs held the loop (every other client) for a second at its commit, its jobs
    all indexed there. The first few thousand are indexed at the commit, the rest a few thousand a turn; a cancel
    of one not indexed yet waits for it."""
    monkeypatch.setattr(jobs_engine, "TURN_JOBS", 100)
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        q = store.queue("q", dict, database=db)
        await q.add({"n": -1})
        index = await store._core.engines["jobs"]._queue("q")  # read only: to see the index under way
        ids = await db.tx(lambda tx: tx.with_(q).add_many([{"n": i} for i in range(3_000)]))
        assert index.placing and len(index.entries) < 3_001  # (the rest: in turns, after the commit)
        assert await q.cancel(ids[-1])  # (waits for its index)
        for _ in range(1000):
            if not index.placing:
                break
            await asyncio.sleep(0)
        assert not index.placing and all(i in index.entries for i in ids[:-1])
        job = await q.get(ids[-1])
        assert job is not None and job.state == "cancelled"
        assert (await q.get(ids[0])).state == "queued"  # type: ignore[union-attr]


@pytest.mark.parametrize("in_tx", [False, True], ids=["add_many", "tx_add_many"])
# contract: JOB-06
async def test_a_big_add_many_encodes_its_values_a_few_thousand_a_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_tx: bool
) -> None:
    """100,000 values were encoded by the SDK in one turn (1 to 2 s with the loop held: an embedded store's other
    clients too). A few thousand a turn now; a bad value past the first turn's still names its place, and nothing
    is added."""
    from tinystore.client import jobs as client_jobs

    monkeypatch.setattr(client_jobs, "ENCODE_TURN", 100)
    turns = 0
    seen: list[int] = []
    real = client_jobs.Queue._many_slice

    def noted(self: Any, *args: Any) -> Any:
        seen.append(turns)
        return real(self, *args)

    monkeypatch.setattr(client_jobs.Queue, "_many_slice", noted)
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        q = store.queue("q", dict, database=db)

        async def add(values: list[Any]) -> list[str]:
            if in_tx:
                return await db.tx(lambda tx: tx.with_(q).add_many(values))
            return await q.add_many(values)

        add_task = asyncio.ensure_future(add([{"n": i} for i in range(1_000)]))
        while not add_task.done():
            turns += 1
            await asyncio.sleep(0)
        assert len(add_task.result()) == 1_000
        assert len(seen) == 10 and len(set(seen)) == 10  # (each slice in a turn of its own)
        bad: list[Any] = [{"n": i} for i in range(1_000)]
        bad[777] = {"n": float("nan")}
        with pytest.raises(tinystore.InvalidError, match=r"values\[777\]"):
            await add(bad)
        assert len((await q.list(limit=1000)).jobs) == 1_000
