"""Trial CQ (jobs from the documentation only): a handler's own ``LostError``, the test clock's end, and a history
of many small errors cut at once."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from .util import claim, report


@pytest.fixture(params=["embedded", "private", "tcp"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


@pytest.fixture(params=["embedded", "private"])
async def clocked(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store", clock=datetime(2030, 1, 1)) as s:
        yield s


def _check_order(value: Any) -> None:
    raise tinystore.LostError("order service: the reservation was lost")


# contract: JOB-04
async def test_a_lost_error_the_handler_raises_is_a_failed_attempt_with_its_traceback(
    store: tinystore.Store, caplog: pytest.LogCaptureFixture
) -> None:
    # the worker took any LostError for its attempt's own loss: the error without its traceback, and no log line
    q = store.queue("orders", attempts=1)

    async def handler(value: Any, run: tinystore.Run) -> None:
        _check_order(value)

    jid = await q.add(1)
    with caplog.at_level(logging.INFO, logger="tinystore.jobs"):
        assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert job is not None and job.state == "dead" and job.attempts == 1
    (e,) = job.errors
    assert e.error == "LostError: order service: the reservation was lost"
    assert e.traceback is not None and "_check_order" in e.traceback
    assert any(
        r.levelno == logging.INFO and "attempt 1 failed: LostError: order service" in r.getMessage()
        for r in caplog.records
    )


# contract: JOB-04
async def test_a_lock_lease_lost_in_a_handler_fails_its_attempt_with_its_traceback(tmp_path: Path) -> None:
    # the README's job-and-lock pattern, as the trial ran it: a handler that blocks its loop past the lock's ttl
    async with open_store("private", tmp_path / "store") as store:
        q = store.queue("summaries", attempts=2)
        lock = store.lock("summaries", ttl="1s")

        async def handler(value: Any, run: tinystore.Run) -> str:
            async with lock.hold(value):
                time.sleep(1.3)  # noqa: ASYNC251 (blocking on purpose: the lease runs out at the server meanwhile)
            return "done"

        jid = await q.add(7)
        assert await q.run_due(handler) == 1
        job = await q.get(jid)
        assert job is not None and job.state == "failed" and job.attempts == 1
        (e,) = job.errors
        assert e.error.startswith("LostError: lock summaries") and e.traceback is not None
        assert "handler" in e.traceback


async def test_the_test_clock_stops_at_the_end_of_year_9999(clocked: tinystore.Store) -> None:
    # past it, every add failed (its time was no datetime): the advance is refused, the clock left as it was
    q = clocked.queue("late")
    for _ in range(79):
        await clocked.clock.advance("36500d")  # (a duration is at most 100 years)
    before = await clocked.clock.now()
    assert datetime.fromtimestamp(before).year > 9900
    with pytest.raises(tinystore.InvalidError, match="past the end of year 9999"):
        await clocked.clock.advance("36500d")
    await clocked.clock.advance("1s")  # (and the store's clock with it: a later add is fine)
    assert 0 < await clocked.clock.now() - before < 60
    jid = await q.add(1)
    job = await q.get(jid)
    assert job is not None and job.state == "queued"


# contract: JOB-04
async def test_a_long_history_of_small_errors_is_cut_to_the_newest_50_at_once(tmp_path: Path) -> None:
    # 120 small errors stay under 64 KiB; the attempt whose traceback passes it cuts the history to 50 at once
    async with open_store("embedded", tmp_path / "s", clock=datetime(2030, 1, 1)) as store:
        q = store.queue("chatty", attempts=200, backoff=("1s", "1s"))
        jid = await q.add("x")

        async def fail(traceback: str | None) -> None:
            await store.clock.advance("1s")
            (c,) = await claim(store, "chatty")
            assert await report(store, "chatty", c, "error", error="small", traceback=traceback)

        for _ in range(120):
            await fail(None)
        job = await q.get(jid)
        assert job is not None and len(job.errors) == 120
        for n in range(121, 141):  # (a traceback keeps 4,000 characters: some 15 of them pass 64 KiB)
            await fail("t" * 3_900)
            job = await q.get(jid)
            assert job is not None
            kept = [e.attempt for e in job.errors]
            if len(kept) < n:
                assert kept == list(range(n - 49, n + 1))  # cut at once, by the attempt that passed it
                break
            assert kept == list(range(1, n + 1))
        else:
            raise AssertionError("the history was never cut")
        assert n > 130
