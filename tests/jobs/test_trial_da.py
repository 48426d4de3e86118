"""Trial DA: the store closed while run_due runs a handler; progress set from a thread; steps of one name run at
once; one advance of the test clock past a job's expected time and its timeout; a duration shown in an exponent;
the configure hint of a client over TCP."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store


# contract: JOB-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_closing_the_store_lets_the_handler_of_run_due_end_and_keeps_its_result(
    tmp_path: Path, mode: str
) -> None:
    # the close returned at once; the handler ran on unreported, and its job ended "worker lost" (to run again)
    directory = tmp_path / "s"
    log: list[str] = []
    async with open_store(mode, directory) as store:
        q = store.queue("q", attempts=3, lease="2s")
        jid = await q.add({})
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> str:
            started.set()
            await asyncio.sleep(1.0)
            log.append("finished")
            return "done"

        running = asyncio.create_task(q.run_due(handler))
        await started.wait()
        await store.close()
        assert log == ["finished"]  # the close waited for it
        assert await running == 1
    async with open_store(mode, directory) as store:
        job = await store.queue("q", attempts=3, lease="2s").get(jid)
        assert job is not None and job.state == "succeeded" and job.result == "done", job
        assert job.attempts == 1 and not job.errors, job


# contract: JOB-10
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_progress_set_from_a_thread_is_kept_to_the_last_value(tmp_path: Path, mode: str) -> None:
    # docs/jobs.md hands blocking work to asyncio.to_thread; its set_progress raised "no running event loop", and
    # the last value, sent while the attempt ended, was refused after its end: the job kept {"done": 3} of 5
    def parse(pages: int, run: tinystore.Run) -> int:
        for n in range(pages):
            time.sleep(0.05)
            run.set_progress({"done": n + 1, "total": pages})
        return pages

    async with open_store(mode, tmp_path / "s") as store:
        q = store.queue("ingest", attempts=1)
        jid = await q.add({"pages": 5})

        async def handler(job: Any, run: tinystore.Run) -> Any:
            return {"pages": await asyncio.to_thread(parse, job["pages"], run)}

        assert await q.run_due(handler) == 1
        job = await q.get(jid)
        assert job is not None and job.state == "succeeded", job
        assert job.progress == {"done": 5, "total": 5}, job.progress


# contract: JOB-12
async def test_steps_of_one_name_run_at_once_are_refused(tmp_path: Path) -> None:
    # gathered steps of one name all ran their fn, the last to end was kept, and only the retry failed
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", attempts=1)
        jid = await q.add({"chunks": ["a", "b", "c"]})
        calls: list[str] = []

        async def embed(chunk: str) -> str:
            calls.append(chunk)
            await asyncio.sleep(0.05)
            return f"vector-of-{chunk}"

        async def handler(value: Any, run: tinystore.Run) -> Any:
            return await asyncio.gather(*(run.step("embed", lambda c=c: embed(c)) for c in value["chunks"]))

        await q.run_due(handler)
        job = await q.get(jid)
        assert job is not None and job.state == "dead", job
        assert "step 'embed': this attempt runs this step already" in (job.error or ""), job.error
        assert calls == ["a"]


# contract: JOB-11
@pytest.mark.parametrize("steps", [["91s"], ["31s", "60s"]])
async def test_one_advance_past_expected_and_timeout_reports_the_job_stuck_first(
    tmp_path: Path, steps: list[str]
) -> None:
    # one advance past both ended the attempt "timed out" with no stuck report: the lease was compared with the time
    # after the advance, not with when the job was due to be stuck
    async with open_store("embedded", tmp_path / "s", clock=datetime(2030, 1, 1)) as store:
        q = store.queue("q", attempts=3)  # expected 30 s, timeout 1 min, lease 30 s (the defaults)
        events: list[tuple[str, str]] = []
        sub = (
            await store.channel("tinystore-jobs", tinystore.JobEvent)
            .under("q")
            .subscribe(lambda m: events.append((m.value.kind, m.value.state)), recursive=True)
        )
        jid = await q.add({})
        started = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            started.set()
            await asyncio.sleep(3600)

        worker = q.work(handler)
        await started.wait()
        for step in steps:
            await store.clock.advance(step)
        job = None
        for _ in range(100):
            job = await q.get(jid)
            if job is not None and job.state != "running":
                break
            await asyncio.sleep(0.05)
        assert job is not None and job.state == "failed", job
        await asyncio.sleep(0.2)
        assert (await store.status())["jobs"]["stuck_reports"] == 1
        assert ("stuck", "running") in events and events.index(("stuck", "running")) < events.index(("state", "failed"))
        await worker.stop(grace=0)
        await sub.stop()


# contract: JOB-03
async def test_a_duration_over_the_limit_is_shown_as_text_the_parser_reads(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q")
        with pytest.raises(tinystore.InvalidError, match=r"at most 100 years \(36500d\), got 36500d0\.000001s$"):
            await q.add(1, delay=timedelta(days=36500, microseconds=1))
        with pytest.raises(tinystore.InvalidError, match=r"got 36500d0\.001s$"):
            await q.add(1, delay=timedelta(days=36500, milliseconds=1))


# contract: JOB-02
async def test_the_configure_hint_of_a_client_over_tcp_names_the_address(tmp_path: Path) -> None:
    # it named the server's own directory, a path a client elsewhere cannot give the command line
    async with open_store("tcp", tmp_path / "s") as store:
        await store.queue("mail", attempts=2).add(1)
        with pytest.raises(tinystore.InvalidError) as caught:
            await store.queue("mail", attempts=3).add(1)
        message = caught.value.message
        assert "tinystore jobs tcp://127.0.0.1:" in message and "configure mail --attempts 3" in message, message
        assert str(tmp_path) not in message and "TINYSTORE_TOKEN=" in message, message


# contract: JOB-04
async def test_a_permanent_error_raised_in_a_task_group_ends_the_job_dead(tmp_path: Path) -> None:
    # it reached the worker as an ExceptionGroup: retried, its error "unhandled errors in a TaskGroup"
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", attempts=3)
        permanent = await q.add("permanent")
        mixed = await q.add("mixed")

        async def handler(value: str, run: tinystore.Run) -> None:
            async def bad() -> None:
                raise tinystore.PermanentError("the PDF is corrupt")

            async def flaky() -> None:
                raise ConnectionError("reset")

            async with asyncio.TaskGroup() as tg:
                if value == "mixed":
                    tg.create_task(flaky())  # (first: it runs before the group's first failure cancels the rest)
                tg.create_task(bad())

        await q.run_due(handler, concurrency=2)
        job = await q.get(permanent)
        assert job is not None and job.state == "dead" and job.error == "the PDF is corrupt", job
        job = await q.get(mixed)
        assert job is not None and job.state == "failed" and job.attempts == 1, job  # retried: not all permanent


# contract: JOB-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_run_due_begun_just_before_the_close_runs_nothing_and_loses_nothing(tmp_path: Path, mode: str) -> None:
    # trial DB: its close hook came after its first waits, so the close did not wait for it: the handler ran after
    # the close, its result lost ("worker lost"), or the job stayed claimed
    directory = tmp_path / "s"
    ran: list[str] = []
    async with open_store(mode, directory) as store:
        q = store.queue("q", attempts=1)
        jid = await q.add({})

        async def handler(value: Any, run: tinystore.Run) -> str:
            ran.append("ran")
            return "r"

        running = asyncio.create_task(q.run_due(handler))
        await asyncio.sleep(0)
        await store.close()
        with pytest.raises(tinystore.ClosedError, match="queue q: run_due: the store is closed"):
            await running
    async with open_store(mode, directory) as store:
        job = await store.queue("q", attempts=1).get(jid)
        assert ran == [] and job is not None and job.state == "queued" and job.attempts == 0, job


# contract: JOB-09
async def test_at_the_close_runs_due_give_their_grace_at_once_and_count_only_what_ended(tmp_path: Path) -> None:
    # trial DB: two run_due (or a worker and a run_due) took 10 s each, one after the other, and run_due counted the
    # attempts the close stopped and handed back
    import tinystore.client.jobs as client_jobs

    directory = tmp_path / "s"
    async with open_store("embedded", directory) as store:
        client_jobs_grace = client_jobs.CLOSE_GRACE
        client_jobs.CLOSE_GRACE = 1.0
        try:
            queues = [store.queue(name) for name in ("a", "b")]
            ids = [await q.add({}) for q in queues]
            started = [asyncio.Event() for _ in queues]

            def handler_of(i: int) -> Any:
                async def handler(value: Any, run: tinystore.Run) -> None:
                    started[i].set()
                    await asyncio.sleep(3600)

                return handler

            running = [asyncio.create_task(q.run_due(handler_of(i))) for i, q in enumerate(queues)]
            for event in started:
                await event.wait()
            t0 = time.monotonic()
            await store.close()
            took = time.monotonic() - t0
        finally:
            client_jobs.CLOSE_GRACE = client_jobs_grace
        assert took < 1.9, took  # one grace for both, not one after the other
        assert [await r for r in running] == [0, 0]
    async with open_store("embedded", directory) as store:
        for name, jid in zip(("a", "b"), ids, strict=True):
            job = await store.queue(name).get(jid)
            assert job is not None and job.state == "queued" and job.attempts == 0, job


# contract: JOB-10
async def test_progress_set_from_a_thread_a_plain_handler_waits_for_is_kept(tmp_path: Path) -> None:
    # trial DB: the loop, blocked by the handler, ran the thread's updates only after the attempt had reported
    from concurrent.futures import ThreadPoolExecutor

    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("q", attempts=1)
        jid = await q.add({"pages": 5})

        def handler(value: Any, run: tinystore.Run) -> str:
            def parse() -> None:
                for n in range(value["pages"]):
                    run.set_progress({"done": n + 1, "total": value["pages"]})

            with ThreadPoolExecutor(1) as pool:
                pool.submit(parse).result()
            return "parsed"

        await q.run_due(handler)
        job = await q.get(jid)
        assert job is not None and job.state == "succeeded" and job.progress == {"done": 5, "total": 5}, job


def test_durations_are_shown_as_text_that_reads_back() -> None:
    from tinystore.durations import format_seconds, seconds

    assert format_seconds(3599.9999999) == "1h" and format_seconds(1e-10) == "0.000001s"
    for value in (1e-10, 0.0015, 59.9999996, 86400 * 2 + 0.25, 36500 * 86400 - 0.5):
        assert abs(seconds(format_seconds(value), "x") - value) <= 1e-6
    with pytest.raises(tinystore.InvalidError, match=r"at most 100 years \(36500d\), got about 1000000000d$"):
        seconds(timedelta(days=999999999, seconds=86399), "delay")


# contract: JOB-01
@pytest.mark.parametrize("how", ["run_due", "work"])
async def test_a_handler_that_closes_its_store_is_not_waited_for_and_its_attempt_counts(
    tmp_path: Path, how: str
) -> None:
    # trial DD: the close waited its 10 s grace for the handler awaiting it, then handed the job back uncounted:
    # a "shutdown" job ran again at every start, never dead
    directory = tmp_path / "s"
    took: list[float] = []
    store = await tinystore.open(directory, embedded=True)
    q = store.queue("q", attempts=3)
    jid = await q.add({})
    done = asyncio.Event()

    async def handler(value: Any, run: tinystore.Run) -> str:
        t0 = time.monotonic()
        try:
            await store.close()
        finally:
            took.append(time.monotonic() - t0)
            done.set()
        return "ok"

    if how == "run_due":
        await q.run_due(handler)
    else:
        q.work(handler)
        await asyncio.wait_for(done.wait(), 10)
    await store.close()
    assert took and took[0] < 3, took
    async with open_store("embedded", directory) as store:
        job = await store.queue("q", attempts=3).get(jid)
        assert job is not None and job.attempts == 1, job  # counted: it cannot come back for ever


async def test_a_value_just_past_a_bound_is_not_shown_as_the_bound(tmp_path: Path) -> None:
    # trial DD: "at most 100 years (36500d), got 36500d", "ttl 1h is outside 1s .. 1h", "-0s", and timeout=0.0004
    # refused as "0s is not above 0"
    from tinystore.durations import seconds

    with pytest.raises(tinystore.InvalidError, match=r"got just over 36500d$"):
        seconds(3153600000.0000005, "duration")
    assert str(seconds(-0.0, "x")) == "0.0"
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(tinystore.InvalidError, match=r"ttl just over 1h is outside 1s \.\. 1h"):
            store.lock("a", ttl=3600.0000001)
        with pytest.raises(tinystore.InvalidError, match=r"ttl 0s is outside"):
            store.lock("b", ttl=-0.0)
        await store.queue("q", timeout=0.0004).add({})  # above 0: a millisecond
