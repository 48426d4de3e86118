"""`tinystore jobs DIR configure` while a queue's jobs run (trial BQ): a shorter lease is renewed in time for the
attempts claimed under it; a shorter keep deletes the jobs that ended before it; a shorter expected reports the
jobs running past it as stuck, in every view."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.client.jobs import configure
from tinystore.protocol.jobs import Options

from ..helpers import open_store


# contract: JOB-01
# contract: JOB-08
@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_an_attempt_under_a_lease_shortened_while_another_runs_is_renewed_in_time(
    tmp_path: Path, mode: str
) -> None:
    # the worker's renewals slept a third of the 30 s lease of the attempt running when they began; the one claimed
    # under the new 2 s lease was lost ("worker lost") by its healthy worker, and ran again
    async with open_store(mode, tmp_path / "s") as store:
        q = store.queue("q", lease="30s", timeout="1m", backoff=("1s", "2s"))
        runs: list[tuple[str, int]] = []

        async def handler(value: Any, run: tinystore.Run) -> None:
            runs.append((value["n"], run.attempt))
            await asyncio.sleep(value["secs"])

        worker = q.work(handler, concurrency=2)
        try:
            a = await q.add({"n": "A", "secs": 4})
            await asyncio.sleep(0.3)
            await configure(store, "q", Options(lease_ms=1000))
            b = await q.add({"n": "B", "secs": 3})
            for _ in range(100):
                got = [await q.get(a), await q.get(b)]
                if all(j is not None and j.state == "succeeded" for j in got):
                    break
                await asyncio.sleep(0.1)
            jb = await q.get(b)
            assert jb is not None and jb.state == "succeeded" and jb.attempts == 1, jb
            assert sorted(runs) == [("A", 1), ("B", 1)]
        finally:
            await worker.stop()


# contract: JOB-02
async def test_a_big_row_read_while_its_inline_budget_runs_out_is_read_by_a_reader(tmp_path: Path) -> None:
    # trial BQ: interrupted while SQLite read a column past the inline length, the read failed "string or blob too
    # big" (SQLITE_INTERRUPT with that message) instead of moving to a reader thread
    limits = tinystore.Limits(inline_read=0.00005)
    async with open_store("embedded", tmp_path / "s", limits=limits) as store:
        q = store.queue("q")
        jid = await q.add({"pad": "v" * ((1 << 20) - 100)})
        for _ in range(300):
            job = await q.get(jid)
            assert job is not None and len(job.value["pad"]) == (1 << 20) - 100


# contract: JOB-05
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_shorter_keep_deletes_the_jobs_that_ended_before_it(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", clock=datetime(2030, 1, 1, 12, tzinfo=UTC)) as store:
        q = store.queue("q", keep="7d")
        old = await q.add({"n": 1}, key="report/2030-01-01")
        await q.run_due(_noop)
        await store.clock.advance("1h")
        await configure(store, "q", Options(keep_ms=60_000))
        await store.clock.advance("2m")
        for _ in range(50):
            if await q.get(old) is None:
                break
            await asyncio.sleep(0.05)
        assert await q.get(old) is None
        assert await q.add({"n": 2}, key="report/2030-01-01") != old  # the key went with it


# contract: JOB-11
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_shorter_expected_reports_the_running_jobs_past_it_in_every_view(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s", clock=datetime(2030, 1, 1, tzinfo=UTC)) as store:
        q = store.queue("q", expected="50m", timeout="2h", lease="1h")
        kinds: list[str] = []
        sub = (
            await store.channel("tinystore-jobs", tinystore.JobEvent)
            .under("q")
            .subscribe(lambda m: kinds.append(m.value.kind), recursive=True)
        )
        gate = asyncio.Event()

        async def wait_gate(value: Any, run: tinystore.Run) -> None:
            await gate.wait()

        await q.add({"i": 1})
        worker = q.work(wait_gate)
        try:
            for _ in range(100):
                if worker.running:
                    break
                await asyncio.sleep(0.02)
            await configure(store, "q", Options(expected_ms=60_000))
            await store.clock.advance("2m")
            for _ in range(100):
                if "stuck" in kinds:
                    break
                await asyncio.sleep(0.02)
            assert len((await q.list(state="stuck")).jobs) == 1
            status = (await store.status())["jobs"]
            assert status["stuck_reports"] == 1 and kinds.count("stuck") == 1, (status, kinds)
        finally:
            gate.set()
            await worker.stop()
            await sub.stop()


async def _noop(value: Any, run: tinystore.Run) -> None:
    return None
