"""An embedded store's own worker dies with its process (kill -9): when the directory is opened again, the
attempt it was running ends "worker lost" at once, not a lease later (an embedded claim has no lease)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import tinystore

from .util import wait_state

CHILD = """
import asyncio, sys, tinystore
async def main(directory, marker):
    store = await tinystore.open(directory, embedded=True, serve=False)
    q = store.queue("crash", lease="30s")
    await q.add("work")
    async def handler(value, run):
        open(marker, "w").write("started")
        await asyncio.sleep(3600)
    q.work(handler)
    await asyncio.sleep(3600)
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


# contract: JOB-08
async def test_an_embedded_workers_attempt_ends_worker_lost_when_the_store_opens_again(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    marker = tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory), str(marker)])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None, "the child ended early"
            assert time.monotonic() < deadline, "the handler never started"
            await asyncio.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    started = time.monotonic()
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        q = store.queue("crash", lease="30s")
        jobs = (await q.list()).jobs
        assert len(jobs) == 1
        job = await wait_state(q, jobs[0].id, "failed", timeout=10)
        assert job.error == "worker lost" and job.attempts == 1
        assert time.monotonic() - started < 10  # not the 30 s lease
    finally:
        await store.close()
