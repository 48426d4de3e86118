"""What a new user met (trial BL): a worker that ended because its queue's options differ from the store's said
so only in a log line (now ``await worker.wait()`` raises it, and the error names the command that changes the
store's options); a queue whose ``expected`` is not below its ``timeout`` never reports a stuck job, silently
(now a warning); a job that succeeded after a failed attempt showed that attempt's error in ``jobs list``."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tinystore
from tinystore.cli import main
from tinystore.client.jobs import configure
from tinystore.errors import InvalidError
from tinystore.protocol.jobs import Options

from ..helpers import open_store


async def _noop(value: Any, run: tinystore.Run) -> None:
    return None


# contract: JOB-02
@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_worker_ended_by_options_that_differ_says_so_in_wait(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        await store.queue("mail", attempts=3).add({"to": "a@x"})
        worker = store.queue("mail", attempts=4, lease="40s").work(_noop)
        with pytest.raises(InvalidError, match=r"option attempts is 4 here but the store keeps 3") as got:
            await asyncio.wait_for(worker.wait(), 10)
        assert "configure mail --attempts 4 --lease 40s" in got.value.message
        assert isinstance(worker.error, InvalidError)
        assert "ended: " in repr(worker)
        # the fix the message names, then a worker with the new options runs the job
        await configure(store, "mail", Options(attempts=4, lease_ms=40_000))
        ran = await store.queue("mail", attempts=4, lease="40s").run_due(_noop)
        assert ran == 1


# contract: JOB-02
async def test_wait_returns_once_the_worker_is_stopped_and_a_cancel_of_it_leaves_the_worker(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q")
        worker = q.work(_noop, concurrency=2)
        waiter = asyncio.ensure_future(worker.wait())
        await asyncio.sleep(0.1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        job = await q.add({"n": 1})
        for _ in range(100):
            got = await q.get(job)
            if got is not None and got.state == "succeeded":
                break
            await asyncio.sleep(0.05)
        assert got is not None and got.state == "succeeded"  # the cancelled wait left it running
        waiter = asyncio.ensure_future(worker.wait())
        await worker.stop()
        await asyncio.wait_for(waiter, 5)
        assert worker.error is None and "stopped" in repr(worker)


# contract: JOB-11
async def test_expected_not_below_timeout_is_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        with caplog.at_level(logging.WARNING, logger="tinystore.jobs"):
            await store.queue("ingest", expected="2m").add({})  # the default timeout is 1 min
            await store.queue("fine", expected="2m", timeout="10m").add({})
        warned = [r.getMessage() for r in caplog.records if "is not below timeout" in r.getMessage()]
        assert len(warned) == 1 and "queue ingest: expected (2m) is not below timeout (1m)" in warned[0], warned


# contract: JOB-02
def test_jobs_list_shows_no_error_for_a_job_that_succeeded_after_a_failed_attempt(tmp_path: Path) -> None:
    d = tmp_path / "s"

    async def go() -> str:
        store = await tinystore.open(d, embedded=True, clock=datetime.now(UTC))
        try:
            q = store.queue("mail", backoff=("1s", "1s"))
            job = await q.add({"to": "a@x"})
            tries = 0

            async def flaky(value: Any, run: tinystore.Run) -> str:
                nonlocal tries
                tries += 1
                if tries == 1:
                    raise ConnectionError("smtp 451 try later")
                return "sent"

            await q.run_due(flaky)
            await store.clock.advance("2s")  # past the backoff
            await q.run_due(flaky)
            got = await q.get(job)
            assert got is not None and got.state == "succeeded" and got.error is not None
            return job
        finally:
            await store.close()

    job = asyncio.run(go())
    r = CliRunner().invoke(main, ["jobs", str(d), "list"], catch_exceptions=False)
    assert r.exit_code == 0 and job[:10] in r.output and "succeeded" in r.output
    assert "smtp 451" not in r.output
    r = CliRunner().invoke(main, ["jobs", str(d), "show", job], catch_exceptions=False)
    assert "smtp 451" in r.output  # kept: show lists the failed attempts


# contract: JOB-09
async def test_a_close_that_waits_for_running_handlers_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # from trial BU: Ctrl-C of a program with a running job sat silent for the worker's 10 s of grace
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("slow")
        await q.add(1)
        began = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            began.set()
            await asyncio.sleep(0.3)

        q.work(handler, concurrency=1)
        await asyncio.wait_for(began.wait(), 10)
        with caplog.at_level(logging.WARNING, logger="tinystore"):
            await store.close()
    said = [r.getMessage() for r in caplog.records if "the store is closing" in r.getMessage()]
    assert said and "1 running handler(s) finish for up to 10s" in said[0] and "worker.stop(grace)" in said[0]
