"""A queue's jobs are read in pages at its load after a start (``LOAD_SLICE`` at a time, in the order of their ids)
and indexed a page at a time: the store runs them in the order one whole read gave — priority first, then the
tenant served least recently, then first in — with each job once, and none of the ended ones."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.engines import jobs as jobs_engine

from ..helpers import open_store
from .util import START, claim, report

TENANTS = ("b", "a", "c")


async def _fill(directory: Path) -> None:
    async with open_store("embedded", directory, clock=START) as store:
        q = store.queue("mixed", backoff=("10m", "10m"), attempts=3)
        for i in range(60):
            await q.add(
                {"i": i},
                tenant=TENANTS[i % 3],
                priority=5 if i % 7 == 0 else 0,
                delay="1h" if i % 5 == 0 else None,
            )
        await q.add({"i": "flaky"}, tenant="a", priority=9)
        await q.add({"i": "ends"}, tenant="b", priority=9)
        # before the stop, one job ends and one fails (its retry is due in 10 minutes: a job the load reads as
        # failed, and delays)
        got = {c.value: c for c in await claim(store, "mixed", 2)}
        assert set(got) == {'{"i":"flaky"}', '{"i":"ends"}'}, set(got)
        assert await report(store, "mixed", got['{"i":"ends"}'])
        assert await report(store, "mixed", got['{"i":"flaky"}'], "error", error="RuntimeError: not yet")


async def _run_all(directory: Path) -> list[Any]:
    order: list[Any] = []

    async def handler(value: dict[str, Any], run: tinystore.Run) -> None:
        order.append(value["i"])

    async with open_store("embedded", directory, clock=START + timedelta(minutes=1)) as store:
        q = store.queue("mixed", backoff=("10m", "10m"), attempts=3)
        await q.run_due(handler, concurrency=1)
        await store.clock.advance("2h")
        await q.run_due(handler, concurrency=1)
        status = (await store.status())["jobs"]["queues"]
        (mixed,) = [s for s in status if s["queue"] == "mixed"]
        assert mixed["queued"] == mixed["delayed"] == mixed["running"] == 0, mixed
    return order


# contract: JOB-07
async def test_a_queue_loaded_in_pages_runs_as_if_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole, paged = tmp_path / "whole", tmp_path / "paged"
    await _fill(whole)
    shutil.copytree(whole, paged)

    expected = await _run_all(whole)  # (62 jobs: one page)
    assert jobs_engine.LOAD_SLICE > 62
    monkeypatch.setattr(jobs_engine, "LOAD_SLICE", 4)
    got = await _run_all(paged)  # 16 pages, one of them short; the ended jobs are passed over

    assert got == expected
    assert sorted(got, key=str) == sorted({*got}, key=str)  # each job once
    assert "ends" not in got and len(got) == 61  # what ended before the stop does not run again
    assert sorted(got[:7]) == [7, 14, 21, 28, 42, 49, 56]  # priority 5 first (0 and 35 are delayed), then the rest
    assert got[-1] == "flaky" or "flaky" in got[-13:]  # due after 10 minutes, with the jobs delayed an hour
