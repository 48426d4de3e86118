"""The fault test: 2,000 jobs, workers in four processes, some killed with SIGKILL and restarted.

Every job ends ``succeeded`` or ``dead`` as it should (every 50th raises PermanentError), none is lost, and
each job's effect (a row recording the attempt's fence, and a counter bumped in the same transaction) is
applied exactly once (JOB-01, JOB-03, JOB-08). Bounded: under two minutes.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.client.jobs import queues

from ..helpers import ServerProcess
from .procs import WorkerProcess, starts

SCHEMA = [
    (
        "001.sql",
        "create table effects (job_id text primary key, fence integer not null, pid integer);\n"
        "create table counter (id integer primary key, n integer not null);\n"
        "insert into counter values (1, 0);",
    )
]
JOBS = 2000


# contract: JOB-01
@pytest.mark.slow
async def test_jobs_survive_killed_workers_and_apply_their_effect_once(tmp_path: Path) -> None:
    began = time.monotonic()
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    store = await tinystore.open(d)
    log = tmp_path / "fault.log"
    workers: list[WorkerProcess] = []
    rng = random.Random(2002)
    try:
        db = await store.database("app", migrations=SCHEMA)
        q = store.queue("fault", attempts=10, lease="1s", backoff=("100ms", "300ms"))
        ids = await q.add_many([{"n": i} for i in range(JOBS)])
        workers = [await WorkerProcess(d, "fault", "fault", log, concurrency=8).start() for _ in range(4)]
        kills = 0
        while True:
            [info] = [i for i in await queues(store) if i.queue == "fault"]
            ended = info.counts["succeeded"] + info.counts["dead"]
            if ended == JOBS:
                break
            assert time.monotonic() - began < 110, f"only {ended} of {JOBS} jobs ended: {info.counts}"
            await asyncio.sleep(0.3)
            if kills < 8 and len(starts(log)) > 150 * (kills + 1):
                i = rng.randrange(len(workers))
                await workers[i].kill()
                kills += 1
                workers[i] = await WorkerProcess(d, "fault", "fault", log, concurrency=8).start()
        assert kills == 8
        jobs = {}
        after = None
        while True:
            page = await q.list(limit=1000, after=after)
            jobs.update({j.id: j for j in page.jobs})
            if page.next is None:
                break
            after = page.next
        assert set(jobs) == set(ids)
        for jid, n in zip(ids, range(JOBS), strict=True):
            job = jobs[jid]
            if n % 50 == 0:
                assert job.state == "dead" and job.error == f"job {n} cannot succeed", (n, job)
            else:
                assert job.state == "succeeded" and job.result == n, (n, job)
        effects = {r["job_id"]: r["fence"] for r in await db.all("select job_id, fence from effects")}
        assert len(effects) == JOBS - JOBS // 50
        assert await db.scalar("select n from counter") == JOBS - JOBS // 50
        for jid, fence in effects.items():
            assert jobs[jid].state == "succeeded" and fence <= jobs[jid].fence
        lost = [j for j in jobs.values() if any(e.error == "worker lost" for e in j.errors)]
        assert lost, "no job was running in a killed worker"
        assert len(starts(log)) >= JOBS
    finally:
        for w in workers:
            await w.stop()
        await store.close()
        server.stop()
    assert time.monotonic() - began < 120
