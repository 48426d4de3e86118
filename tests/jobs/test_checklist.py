"""The checklist at the end of the seed "Sync and Async Work", point by point, for the points about jobs.

The seed's first two points (chat answers stream through proxies without buffering; keep-alive events during
long model pauses) are about streaming, not jobs: the SSE bridge's tests hold them.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from .util import START, wait_state, wait_until

SCHEMA = [("001.sql", "create table chunks (id text primary key, doc_id text not null, text text not null);")]


# checklist: "Anything that can take more than about 10 seconds is a job with a database record."
async def test_long_work_is_a_job_with_a_database_record(tmp_path: Path) -> None:
    d = tmp_path / "store"
    async with open_store("embedded", d) as store:
        db = await store.database("app", migrations=SCHEMA)
        q = store.queue("ingest", database=db)
        jid = await q.add(
            {"doc": "handbook.pdf"}, key="ingest/handbook", tenant="org-7", user="u-3", type="ingest_file"
        )

        async def handler(value: Any, run: tinystore.Run) -> Any:
            run.set_progress({"done": 300, "total": 300})
            return {"chunks": 300}

        await q.run_due(handler)
    # the record is a row of the application's own database, there after a restart, with the seed's columns
    async with open_store("embedded", d) as store:
        db = await store.database("app")
        row = await db.one(
            "select id, tenant, user, type, state, attempts, progress, error, key, created_at, started_at, "
            "finished_at from _tinystore_jobs where id = ?",
            jid,
        )
        assert row is not None
        assert (row["tenant"], row["user"], row["type"], row["state"], row["attempts"], row["key"]) == (
            "org-7",
            "u-3",
            "ingest_file",
            "succeeded",
            1,
            "ingest/handbook",
        )
        assert row["progress"] == '{"done":300,"total":300}' and row["error"] is None
        assert row["created_at"] <= row["started_at"] <= row["finished_at"]
        job = await store.queue("ingest", database=db).get(jid)
        assert job is not None and job.state == "succeeded" and job.progress == {"done": 300, "total": 300}


# checklist: "Every job is idempotent and has a retry limit."
async def test_every_job_is_idempotent_and_has_a_retry_limit(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "store", clock=START) as store:
        db = await store.database("app", migrations=SCHEMA)
        q = store.queue("ingest", database=db, attempts=3)
        jid = await q.add({"doc": "d1", "chunks": 4}, key="ingest/d1")
        assert await q.add({"doc": "d1", "chunks": 4}, key="ingest/d1") == jid  # a duplicate add adds nothing

        async def ingest(value: Any, run: tinystore.Run) -> int:
            # deterministic chunk ids and upserts: running twice gives what running once gives
            for pos in range(value["chunks"]):
                await db.exec(
                    "insert into chunks (id, doc_id, text) values (?, ?, ?) on conflict (id) do update "
                    "set text = excluded.text",
                    f"{value['doc']}/{pos}",
                    value["doc"],
                    f"chunk {pos}",
                )
            if run.attempt == 1:
                raise ConnectionError("the worker crashed after writing")  # delivered again
            return int(value["chunks"])

        await q.run_due(ingest)
        await store.clock.advance("10s")
        await q.run_due(ingest)
        job = await q.get(jid)
        assert job is not None and (job.state, job.attempts) == ("succeeded", 2)
        assert await db.scalar("select count(*) from chunks") == 4

        hopeless = await q.add({"doc": "d2", "chunks": 0})

        async def always_fails(value: Any, run: tinystore.Run) -> None:
            raise ConnectionError("503")

        for _ in range(6):
            await q.run_due(always_fails)
            await store.clock.advance("5m")
        job = await q.get(hopeless)
        assert job is not None and (job.state, job.attempts) == ("dead", 3)  # the retry limit


# checklist: "Permanent failures are not retried."
async def test_permanent_failures_are_not_retried(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "store", clock=START) as store:
        q = store.queue("parse", attempts=5)
        jid = await q.add({"file": "broken.pdf"})
        runs = 0

        async def parse(value: Any, run: tinystore.Run) -> None:
            nonlocal runs
            runs += 1
            raise tinystore.PermanentError("the PDF is corrupt")

        for _ in range(3):
            await q.run_due(parse)
            await store.clock.advance("10m")
        job = await q.get(jid)
        assert job is not None and (job.state, job.attempts, job.error, runs) == ("dead", 1, "the PDF is corrupt", 1)
        assert [j.id for j in (await q.list(state="dead")).jobs] == [jid]  # the reason is shown to support


# checklist: "One tenant cannot starve others in the job queue."
async def test_one_tenant_cannot_starve_others(tmp_path: Path) -> None:
    async with open_store("sidecar", tmp_path / "store") as store:
        q = store.queue("uploads", max_running_per_tenant=1)
        order: list[str] = []

        async def handler(value: Any, run: tinystore.Run) -> None:
            order.append(run.tenant)
            await asyncio.sleep(0.01)

        await q.add_many([{"n": i} for i in range(200)], tenant="big")
        worker = q.work(handler, concurrency=2)
        try:
            await wait_until(lambda: len(order) >= 5, what="the big tenant's jobs running")
            at = len(order)
            small = await q.add({"n": 0}, tenant="small")
            await wait_state(q, small, "succeeded")
            assert order.index("small") <= at + 2  # the next free slot, not after the other 195 jobs
        finally:
            await worker.stop(grace=0)


# checklist: "Stuck jobs, running longer than expected, trigger an alert."
async def test_stuck_jobs_trigger_an_alert(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tinystore.jobs")
    async with open_store("embedded", tmp_path / "store", clock=datetime(2030, 1, 1)) as store:
        q = store.queue("sync", expected="5m", timeout="1h")
        alerts: list[tinystore.JobEvent] = []
        sub = (
            await store.channel("tinystore-jobs", tinystore.JobEvent)
            .under("sync")
            .subscribe(lambda m: alerts.append(m.value) if m.value.kind == "stuck" else None, recursive=True)
        )
        release = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            await release.wait()

        jid = await q.add({"connector": "drive"}, tenant="org-1")
        worker = q.work(handler)
        try:
            await wait_state(q, jid, "running")
            await store.clock.advance("6m")
            await wait_until(lambda: alerts, what="the stuck alert")
            assert alerts[0].job_id == jid and alerts[0].state == "running"
            assert (await store.status())["jobs"]["stuck_reports"] == 1
            assert any(f"job {jid} is stuck" in r.getMessage() for r in caplog.records)
            assert [j.id for j in (await q.list(state="stuck")).jobs] == [jid]
        finally:
            release.set()
            await worker.stop()
            await sub.stop()
