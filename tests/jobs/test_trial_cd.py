"""From trial CD: a new user moving background work from Celery/RQ."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.client import jobs as client_jobs
from tinystore.client.jobs import configure
from tinystore.protocol.jobs import Options

from ..cli.support import run_cli
from ..helpers import open_store

START = datetime(2030, 1, 1, tzinfo=UTC)


# contract: JOB-03
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_attempts_lowered_end_the_jobs_that_made_as_many(tmp_path: Path, mode: str) -> None:
    """Lowered to stop retries against a service that is down, the jobs waiting for their retry ran once more
    each and ended dead "2/1". Those that made as many attempts as now allowed end dead at once, keeping their
    last error; the others go on under the new count."""
    async with open_store(mode, tmp_path / "s", clock=START) as store:
        q = store.queue("mail", attempts=5, backoff=("10s", "10s"))
        calls: list[tuple[str, int]] = []

        async def failing(value: Any, run: tinystore.Run) -> None:
            calls.append((value["to"], run.attempt))
            raise RuntimeError("smtp 421")

        twice = await q.add({"to": "twice"})
        await q.run_due(failing)
        await store.clock.advance("11s")
        once = await q.add({"to": "once"})
        await q.run_due(failing)  # twice: attempt 2; once: attempt 1
        fresh = await q.add({"to": "fresh"}, delay="1m")
        assert sorted(calls) == [("once", 1), ("twice", 1), ("twice", 2)]

        await configure(store, "mail", Options(attempts=2))
        q = store.queue("mail", attempts=2, backoff=("10s", "10s"))
        job = await q.get(twice)
        assert job is not None and job.state == "dead" and job.attempts == 2 and job.max_attempts == 2, job
        assert job.error is not None and "smtp 421" in job.error
        job = await q.get(once)
        assert job is not None and job.state == "failed" and job.attempts == 1, job

        await store.clock.advance("2m")
        await q.run_due(failing)
        assert ("twice", 3) not in calls and ("once", 2) in calls and ("fresh", 1) in calls
        for jid, attempts in ((once, 2), (fresh, 1)):
            job = await q.get(jid)
            assert job is not None and job.attempts == attempts and job.attempts <= job.max_attempts, job
        status = (await store.status())["jobs"]["queues"]
        assert [s["queued"] + s["delayed"] for s in status if s["queue"] == "mail"] == [1]  # (fresh: its retry)


# contract: JOB-11
async def test_only_an_expected_given_is_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A queue given only a short timeout was warned, in every process, of the default expected (30 s) it never
    set. ``tinystore jobs DIR configure`` says it to who asked (the server only logged it)."""
    async with open_store("embedded", tmp_path / "s") as store:
        with caplog.at_level(logging.WARNING, logger="tinystore.jobs"):
            await store.queue("short", timeout="2s").add({})
            await store.queue("slip", expected="2m").add({})
        warned = [r.getMessage() for r in caplog.records if "is not below timeout" in r.getMessage()]
        assert len(warned) == 1 and warned[0].startswith("queue slip: expected (2m)"), warned
    done = run_cli("jobs", str(tmp_path / "s"), "configure", "short", "--expected", "1h", "--json")
    assert done.returncode == 0, done.stderr
    assert "warning: queue short: expected (1h) is not below timeout (2s)" in done.stderr
    done = run_cli("jobs", str(tmp_path / "s"), "configure", "short", "--expected", "1s", "--json")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr


# contract: JOB-11
async def test_configure_by_a_command_that_opened_the_store_itself_warns_once(tmp_path: Path) -> None:
    # trial CY: with no server running, the command's own engines logged the warning too: it was printed twice
    async with open_store("embedded", tmp_path / "s") as store:
        await store.queue("short", timeout="2s").add({})
    done = run_cli("jobs", str(tmp_path / "s"), "configure", "short", "--expected", "1h", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("is not below timeout") == 1, done.stderr
    assert "warning: queue short: expected (1h) is not below timeout (2s)" in done.stderr


# contract: JOB-09
async def test_a_handler_that_ignores_its_cancel_is_told_of_at_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop`` returned (after grace + 10 s) while a handler that swallowed its cancel ran on, and said nothing;
    its docstring promised no handler runs then."""
    monkeypatch.setattr(client_jobs, "CANCEL_WAIT", 0.3)
    async with open_store("private", tmp_path / "s") as store:
        q = store.queue("q", lease="30s")
        started = asyncio.Event()
        let_go = asyncio.Event()

        async def stubborn(value: Any, run: tinystore.Run) -> None:
            started.set()
            while not let_go.is_set():
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    pass  # (the slip: a bare except that eats the cancel)

        worker = q.work(stubborn)
        await q.add({})
        await started.wait()
        with caplog.at_level(logging.WARNING, logger="tinystore.jobs"):
            await asyncio.wait_for(worker.stop(grace="0.1s"), 5)
        let_go.set()
        warned = [r.getMessage() for r in caplog.records if "after their cancel" in r.getMessage()]
        assert len(warned) == 1 and warned[0].startswith("queue q: 1 handler(s) still run 0.3s after their cancel"), (
            warned
        )


# contract: JOB-03
async def test_attempts_lowered_while_the_queue_loads_end_its_spent_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial CE: lowered while the queue still loaded after a start, nothing ended (the load took the new options
    at its end, and configure compared the index's options with themselves)."""
    from tinystore.engines import jobs as jobs_engine

    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("q", attempts=5, backoff=("1h", "1h"))
        ids = await q.add_many([{"n": i} for i in range(400)])

        async def failing(value: Any, run: tinystore.Run) -> None:
            raise RuntimeError("service down")

        await q.run_due(failing, concurrency=8)
    monkeypatch.setattr(jobs_engine, "LOAD_SLICE", 10)  # (40 pages: the configure comes during them)
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        await configure(store, "q", Options(attempts=1))
        q = store.queue("q", attempts=1, backoff=("1h", "1h"))
        states = {(await q.get(jid)).state for jid in ids[::37]}  # type: ignore[union-attr]
        assert states == {"dead"}, states
        status = (await store.status())["jobs"]["queues"]
        assert [s["queued"] + s["delayed"] for s in status if s["queue"] == "q"] == [0]


# contract: JOB-03
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_attempts_lowered_under_a_running_one_that_snoozes_end_it(tmp_path: Path, mode: str) -> None:
    """Attempts lowered while a job's third attempt ran, which then snoozed (an attempt that does not count):
    it went back to wait with 2 attempts made of 2 allowed, and ran a third time. It ends dead, as a job waiting
    with as many attempts as allowed does when they are lowered."""
    async with open_store(mode, tmp_path / "s", clock=START) as store:
        q = store.queue("mail", attempts=5, backoff=("10s", "10s"))
        calls: list[int] = []

        async def handler(value: Any, run: tinystore.Run) -> Any:
            calls.append(run.attempt)
            if run.attempt < 3:
                raise RuntimeError("smtp 421")
            await configure(store, "mail", Options(attempts=2))
            return run.snooze("1s")

        jid = await q.add({"to": "x"})
        for _ in range(3):
            await q.run_due(handler)
            await store.clock.advance("11s")
        await q.run_due(handler)
        assert calls == [1, 2, 3], calls
        job = await q.get(jid)
        assert job is not None and job.state == "dead" and job.attempts == 2 and job.max_attempts == 2, job
        assert job.error is not None and "smtp 421" in job.error


# contract: JOB-03
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_jobs_left_spent_by_a_configure_cut_short_end_at_the_next_load(tmp_path: Path, mode: str) -> None:
    """A configure that lowered attempts stores the new count, then ends the spent jobs one by one: a server
    killed in between left the rest waiting, and after the restart they ran a third attempt of 2 (the load did
    not look at the count). The load ends them dead, and places those a later count allows."""
    async with open_store(mode, tmp_path / "s", clock=START) as store:
        q = store.queue("mail", attempts=5, backoff=("10s", "10s"))
        ids = await q.add_many([{"n": n} for n in range(5)])

        async def failing(value: Any, run: tinystore.Run) -> None:
            raise RuntimeError("smtp 421")

        for _ in range(2):
            await q.run_due(failing)
            await store.clock.advance("11s")
    # (what the configure cut short leaves: the count stored, the jobs still waiting)
    db = tmp_path / "s" / "sql" / "tinystore-jobs.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("update _tinystore_queues set options = json_set(options, '$.attempts', 2)")
        conn.commit()
    async with open_store(mode, tmp_path / "s", clock=START) as store:
        q = store.queue("mail", attempts=2, backoff=("10s", "10s"))
        calls: list[int] = []

        async def handler(value: Any, run: tinystore.Run) -> None:
            calls.append(run.attempt)

        await store.clock.advance("1m")
        await q.run_due(handler)
        assert calls == [], calls
        for jid in ids:
            job = await q.get(jid)
            assert job is not None and job.state == "dead" and job.attempts == 2, job


async def test_add_many_names_a_shared_argument_as_the_calls(tmp_path: Path) -> None:
    """A tenant too long was reported at ``values[0]``, though it is the whole call's (trial CH)."""
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q")
        with pytest.raises(tinystore.InvalidError, match=r"^queue q: add_many: tenant '"):
            await q.add_many([1, 2], tenant="x" * 300)
        with pytest.raises(tinystore.InvalidError, match=r"^queue q: add_many: keys\[1\]: key ''"):
            await q.add_many([1, 2], keys=["a", ""])


# contract: JOB-03
async def test_a_failure_written_as_attempts_are_lowered_ends_the_job(tmp_path: Path) -> None:
    """A failure whose write was under way when a configure lowered attempts (the attempt still running when the
    configure looked) landed as failed 2/1, and the job ran a third time (trial CK)."""
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("q", attempts=3, backoff=("1s", "1s"))
        await q.add_many([{"i": i} for i in range(1500)])

        async def failing(value: Any, run: tinystore.Run) -> None:
            raise RuntimeError("down")

        await q.run_due(failing, concurrency=200)
        await store.clock.advance("3s")
        second = asyncio.ensure_future(q.run_due(failing, concurrency=100))
        await asyncio.sleep(0.01)
        await configure(store, "q", Options(attempts=1))
        await second
        db = await store.database("tinystore-jobs")
        rows = await db.all("select state, attempts, count(*) as n from _tinystore_jobs group by 1, 2")
        assert all(r["state"] == "dead" for r in rows), rows
        calls: list[int] = []

        async def counting(value: Any, run: tinystore.Run) -> None:
            calls.append(run.attempt)

        await store.clock.advance("10s")
        await q.run_due(counting)
        assert calls == [], calls[:5]


# contract: JOB-03
async def test_attempts_raised_while_the_load_ends_spent_jobs_keep_them(tmp_path: Path) -> None:
    """A configure that raised attempts while a store's start still ended the jobs spent under the lowered count
    was answered, and every job ended dead all the same (trial CK)."""
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("q", attempts=3)
        await q.add_many([{"i": i} for i in range(20000)])
    path = tmp_path / "s" / "sql" / "tinystore-jobs.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("update _tinystore_jobs set state = 'failed', attempts = 1, error = 'down'")
        conn.execute("update _tinystore_queues set options = json_set(options, '$.attempts', 1)")
        conn.commit()
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        db = await store.database("tinystore-jobs")
        count = "select count(*) from _tinystore_jobs where state = 'dead'"
        while await db.scalar(count) == 0:  # (the start's load is ending them)
            await asyncio.sleep(0.005)
        await configure(store, "q", Options(attempts=5))
        rows = {r["state"]: r["n"] for r in await db.all("select state, count(*) as n from _tinystore_jobs group by 1")}
        assert rows.get("failed", 0) > 0, rows  # (those still waiting when the count rose go on under it)
