"""A handler that does not stop when its timeout cancels it (it swallows the cancel, or blocks its thread) ends
all the same: the store fails the attempt, "timed out", a lease after the timeout, whatever its worker's renewals
say, and the job goes on to its retry or its end (JOB-01). From trial AO: such a job stayed running, its lease
renewed, for ever."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from .util import START, claim, other_client, renew, wait_state, wait_until


# contract: JOB-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_renewals_carry_no_attempt_past_its_timeout_and_a_lease(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", clock=START) as store:
        q = store.queue("q", timeout="10s", lease="3s", expected="1h", attempts=2)
        await q.options()
        job_id = await q.add("x")
        async with other_client(store) if mode == "embedded" else _same(store) as client:
            (c,) = await claim(client, "q")  # a worker whose handler never ends, and whose renewals go on
            for _ in range(6):  # 12 s: past the timeout, renewed every 2 s
                await store.clock.advance("2s")
                assert await renew(client, "q", c) == []
                assert (await q.get(job_id)).state == "running"  # type: ignore[union-attr]
            await store.clock.advance("2s")  # 14 s: past the timeout and a lease (13 s)
            job = await wait_state(q, job_id, "failed", timeout=5)
            assert job.attempts == 1 and "timed out" in (job.error or ""), job
            assert await renew(client, "q", c) == [c.id]  # the attempt is over: its worker hears it is lost


class _same:
    def __init__(self, store: tinystore.Store) -> None:
        self.store = store

    async def __aenter__(self) -> tinystore.Store:
        return self.store

    async def __aexit__(self, *exc: object) -> None:
        return None


# contract: JOB-01
# contract: JOB-03
async def test_an_embedded_workers_handler_that_swallows_its_cancel_is_timed_out(tmp_path: Path) -> None:
    # an embedded store's own worker has no lease: nothing ended such an attempt, ever
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("q", timeout="5s", lease="3s", expected="1h", attempts=2)
        release = asyncio.Event()
        runs: list[int] = []

        async def stubborn(value: Any, run: tinystore.Run) -> None:
            runs.append(run.attempt)
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    continue  # the timeout's cancel, swallowed

        worker = q.work(stubborn, concurrency=1)
        try:
            job_id = await q.add("x")
            await wait_until(lambda: runs == [1], what="the first attempt to start")
            await store.clock.advance("6s")  # past the timeout: the worker cancels the handler, which runs on
            await asyncio.sleep(0.2)
            assert (await q.get(job_id)).state == "running"  # type: ignore[union-attr]
            await store.clock.advance("3s")  # past the timeout and a lease: the store ends the attempt
            job = await wait_state(q, job_id, "failed", timeout=5)  # (its retry comes after the backoff)
            assert job.attempts == 1 and "timed out" in (job.error or ""), job
        finally:
            release.set()
            await worker.stop(grace="2s")


# contract: JOB-01
async def test_a_running_attempt_keeps_its_lease_and_outlives_a_shorter_timeout_across_a_restart(
    tmp_path: Path,
) -> None:
    # from trial AP: a configure that shortened the lease gave running attempts the short lease at their next
    # renewal (they ended "worker lost"); one that shortened the timeout, then a restart, ended them at once
    # "timed out". docs/jobs.md: an attempt already running keeps the lease and timeout it was given
    import os
    import signal

    from tinystore.client.jobs import configure
    from tinystore.protocol.jobs import Options

    async with open_store("private", tmp_path / "s", clock=START) as store:
        q = store.queue("q", timeout="1m", lease="10s", expected="1h")
        await q.options()
        job_id = await q.add("x")
        (c,) = await claim(store, "q")
        await configure(store, "q", Options(lease_ms=2_000, timeout_ms=5_000))
        await store.clock.advance("5s")
        assert await renew(store, "q", c) == []  # a lease of 10 s from now, as given, not 2 s
        await store.clock.advance("6s")
        assert (await q.get(job_id)).state == "running"  # type: ignore[union-attr]
        for _ in range(2):  # 29 s: past the new timeout and lease, long before the one it was given
            assert await renew(store, "q", c) == []
            await store.clock.advance("9s")
        assert await renew(store, "q", c) == []
        pid = (await store.status())["pid"]
        os.kill(pid, signal.SIGKILL)  # the store restarts (the SDK starts its private server again) and loads it
        await wait_until(lambda: store.transport.connected, what="the SDK to reconnect")
        job = await wait_state(q, job_id, "running", "failed", timeout=10)
        assert job.state == "running" and not job.error, job
        # from trial AR: the restart gave it the queue's lease of now (2 s), and its worker, renewing at a third
        # of the 10 s it was given, lost it. It keeps the 10 s across the restart too
        assert await renew(store, "q", c) == []
        await store.clock.advance("9s")
        assert await renew(store, "q", c) == []
        job = await q.get(job_id)
        assert job is not None and job.state == "running" and not job.error, job
