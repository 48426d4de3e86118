"""A queue's jobs are read in pages at its load after a start (``LOAD_SLICE`` at a time, in the order of their ids)
and indexed a page at a time: the store runs them in the order one whole read gave — priority first, then the
tenant served least recently, then first in — with each job once, and none of the ended ones."""

from __future__ import annotations

import gc
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.engines import gc_hold
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


async def _load_watching_gc(directory: Path) -> list[bool]:
    """Open the store at ``directory``, and load queue ``mixed`` (in pages of 4): whether the collector was on at
    each page the load read."""
    seen: list[bool] = []
    read_page = jobs_engine.JobQueue.place_loaded

    def watched(self: Any, entries: Any) -> None:
        seen.append(gc.isenabled())
        read_page(self, entries)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jobs_engine, "LOAD_SLICE", 4)
        patch.setattr(jobs_engine.JobQueue, "place_loaded", watched)
        async with open_store("embedded", directory, clock=START) as store:
            await store.queue("mixed", backoff=("10m", "10m"), attempts=3).add({"i": "after"})
    return seen


async def test_a_big_load_holds_the_collector_off_and_gives_it_back(tmp_path: Path) -> None:
    """A queue of a million jobs took 14.6 s to load, 2.9 s of it in 11 full collections that stopped the loop for
    up to 0.7 s (each walks every job read so far); with the collector held off during the load: 7.9 s, no
    stop over 0.08 s. An embedded application gets its collector back as it had it, never frozen."""
    await _fill(tmp_path / "s")
    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    pages = await _load_watching_gc(tmp_path / "s")
    assert len(pages) == 16 and not any(pages), pages  # (held from the first full page on)
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen  # (embedded: FREEZE is for a server's own process)

    gc.disable()
    try:
        assert not any(await _load_watching_gc(tmp_path / "s"))
        assert not gc.isenabled()  # left as found
    finally:
        gc.enable()


def test_the_last_hold_freezes_in_a_server_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process that is only a store's server (``gc_hold.FREEZE``), what is alive when the last load ends
    moves to the permanent generation: no later full collection walks the jobs read."""
    monkeypatch.setattr(gc_hold, "FREEZE", True)
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(gc.isenabled()))
    frozen: list[bool] = []
    with gc_hold.held():
        with gc_hold.held():
            assert not gc.isenabled()
        assert frozen == [] and not gc.isenabled()  # (loads of two queues overlap: the first one's end is not the last)
    assert frozen == [False] and gc.isenabled()
