"""A fault test in separate processes (bounded: about 30 s): workers increment a counter row through a fenced
write under the lock, while some are paused with SIGSTOP/SIGCONT for more or less than their ttl and the
server is killed and started again once. Afterwards the counter equals the number of accepted writes, the
accepted writes came in fence order, and no fence was given twice."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.server import paths

from ..helpers import stop_sidecar
from .support import Actor

SCHEMA = [
    (
        "001_counter.sql",
        """
        create table counter (id integer primary key, value integer not null, fence text not null);
        insert into counter values (1, 0, '');
        create table writes (n integer primary key, fence text not null);
        -- every write that got through the fence, in the statement's own transaction
        create trigger counted after update of value on counter begin
            insert into writes (fence) values (new.fence);
        end;
        """,
    )
]
WORKERS = 6
CHAOS = 18.0


@pytest.mark.slow
# contract: LOCK-01, LOCK-02
async def test_fenced_counter_survives_freezes_and_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    rng = random.Random(int(os.environ.get("LOCK_FAULT_SEED", "7")))
    store = await tinystore.open(directory, idle="0s")
    workers: list[Actor] = []
    try:
        db = await store.database("app", migrations=SCHEMA)
        until = time.time() + CHAOS
        cfg = {"mode": "fault", "dir": str(directory), "db": "app", "ttl": "1s", "wait": 3, "until": until}
        workers = [await Actor(**cfg).start() for _ in range(WORKERS)]
        restarted = False
        paused: dict[int, float] = {}
        while time.time() < until:
            now = time.monotonic()
            for i, resume_at in list(paused.items()):
                if now >= resume_at:
                    workers[i].signal(signal.SIGCONT)
                    del paused[i]
            if len(paused) < WORKERS // 2 and rng.random() < 0.5:
                i = rng.randrange(WORKERS)
                if i not in paused:
                    workers[i].signal(signal.SIGSTOP)
                    paused[i] = now + rng.choice([0.3, 0.6, 1.5, 2.5])  # shorter and longer than the 1 s ttl
            if not restarted and time.time() > until - CHAOS / 2:
                info = paths.read_address(directory) or {}
                os.kill(int(info["pid"]), signal.SIGKILL)  # the workers' SDKs start a sidecar again
                restarted = True
            await asyncio.sleep(rng.uniform(0.1, 0.4))
        for w in workers:
            w.signal(signal.SIGCONT)
        for w in workers:
            await w.event("done", timeout=30)

        value = await db.scalar("select value from counter where id = 1")
        written = [r["fence"] for r in await db.all("select fence from writes order by n")]
    finally:
        for w in workers:
            await w.stop()
        await store.close()
        await stop_sidecar(directory)

    held = [e["fence"] for w in workers for e in w.named("held")]
    reports = [e for w in workers for e in w.named("counter")]
    accepted = [e["fence"] for e in reports if e["accepted"] is True]
    unknown = {e["fence"] for e in reports if e["accepted"] is None}
    errors = [e["code"] for w in workers for e in w.named("error")]

    assert value == len(written)  # the counter equals the number of writes that got through
    assert written == sorted(written) and len(set(written)) == len(written)  # in fence order, none twice
    assert len(set(held)) == len(held)  # no fence was given twice, across the restart too
    assert set(accepted) <= set(written)  # every write a worker saw accepted is counted
    assert set(written) <= set(accepted) | unknown  # and nothing else got through
    # the run did what it was meant to: progress, fences of two store runs, leases lost to freezes
    assert len(accepted) > 20, (len(accepted), errors[:20])
    assert len({int(f) >> 64 for f in held}) == 2
    assert "lost" in errors
