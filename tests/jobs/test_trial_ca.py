"""From trial CA (an operator with a backlog of 300,000 jobs, restarting the store under load)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tinystore.engines.sql import SqlDatabase

from ..helpers import open_store
from .util import claim, report, wait_state


def _hook_after_read(
    monkeypatch: pytest.MonkeyPatch, matches: Callable[[str], bool]
) -> tuple[list[Callable[[], Awaitable[Any]]], list[asyncio.Task[None]]]:
    """Make the next read whose SQL ``matches`` run a hook (popped from the list returned first) after SQLite
    answered it and before its caller has the rows; the tasks that do so are the second list, to await."""
    hooks: list[Callable[[], Awaitable[Any]]] = []
    tasks: list[asyncio.Task[None]] = []
    read = SqlDatabase.read

    def read_then(self: SqlDatabase, sql: str, params: Any, *args: Any, **kw: Any) -> Any:
        fut = read(self, sql, params, *args, **kw)
        if not matches(sql) or not hooks:
            return fut
        hook = hooks.pop()
        out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def chain() -> None:
            rows = await fut
            await hook()
            out.set_result(rows)

        tasks.append(asyncio.ensure_future(chain()))
        return out

    monkeypatch.setattr(SqlDatabase, "read", read_then)
    return hooks, tasks


# contract: JOB-02
async def test_a_page_of_one_state_holds_only_jobs_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # list picks a page's ids by the filter, then reads their rows: the jobs that ran in between were on a page of
    # state "queued" (or "running") as "succeeded"
    # the jobs change state after their ids were picked
    hooks, tasks = _hook_after_read(monkeypatch, lambda sql: "order by id desc limit" in sql)
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("mail")
        ids = [await q.add({"n": n}) for n in range(3)]
        hooks.append(lambda: q.run_due(lambda value, run: None))
        page = await q.list(state="queued")
        assert [j.state for j in page.jobs] == [] and page.next is None
        assert {j.state for j in (await q.list()).jobs} == {"succeeded"} and len(ids) == 3
    await asyncio.gather(*tasks)


CHILD = """
import asyncio, sys, tinystore
from datetime import datetime
async def main(directory, marker):
    store = await tinystore.open(directory, embedded=True, serve=False, clock=datetime(2030, 1, 1, 12))
    q = store.queue("crash", expected="2s", timeout="1m")
    await q.add("work")
    async def handler(value, run):
        open(marker, "w").write("started")
        await asyncio.sleep(3600)
    q.work(handler)
    await asyncio.sleep(3600)
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


# contract: JOB-10
async def test_the_attempt_of_a_killed_embedded_store_is_lost_not_stuck(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # its attempt ended "worker lost" at the next start, and was reported stuck first: a false alert at each crash
    import os
    import signal
    import subprocess
    import sys
    import time

    directory, marker = tmp_path / "s", tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory), str(marker)])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the handler never started"
            await asyncio.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    later = datetime(2030, 1, 1, 13)  # an hour on: far past expected
    async with open_store("embedded", directory, clock=later, serve=False) as store:
        q = store.queue("crash", expected="2s", timeout="1m")
        (job,) = (await q.list()).jobs
        job = await wait_state(q, job.id, "failed")
        assert job.error == "worker lost"
        await asyncio.sleep(0.1)
        assert (await store.status())["jobs"]["stuck_reports"] == 0
    assert not [r for r in caplog.records if "is stuck" in r.getMessage()]


@pytest.mark.parametrize("timeout", ["10s", "1m"])
async def test_an_attempt_loaded_at_a_start_is_stuck_only_where_jobs_can_be(
    tmp_path: Path, timeout: str, caplog: pytest.LogCaptureFixture
) -> None:
    # expected >= timeout: "no job of this queue is ever reported stuck" (a handler is cancelled at its timeout), yet
    # an attempt loaded at a start, given a whole timeout more from then, was
    directory = tmp_path / "s"
    async with open_store("private", directory, clock=datetime(2030, 1, 1, 12)) as store:
        q = store.queue("mail", expected="10s", timeout=timeout, lease="30s")
        await q.add("x")
        (c,) = await claim(store, "mail")  # a worker in another process, which runs on across the restart
    async with open_store("private", directory, clock=datetime(2030, 1, 1, 12, 0, 20)) as store:
        q = store.queue("mail", expected="10s", timeout=timeout, lease="30s")
        job = await q.get(c.id)
        assert job is not None and job.state == "running"
        await asyncio.sleep(0.2)
        # not at once: an attempt loaded at a start has a whole expected time from then (trial IA: each restart
        # reported every attempt under way stuck, the time the store was down counted as the attempt's)
        assert (await store.status())["jobs"]["stuck_reports"] == 0
        await store.clock.advance("11s")
        await asyncio.sleep(0.2)
        reports = (await store.status())["jobs"]["stuck_reports"]
        assert reports == (0 if timeout == "10s" else 1)


def test_the_json_list_ends_with_the_cursor_of_the_next_page(tmp_path: Path) -> None:
    # with --json no cursor was printed: a script could not tell the last page from a short one
    import json

    from click.testing import CliRunner

    from tinystore.cli import main

    directory = tmp_path / "s"

    async def fill() -> list[str]:
        async with open_store("embedded", directory) as store:
            q = store.queue("mail")
            return [await q.add({"n": n}) for n in range(5)]

    ids = asyncio.run(fill())
    seen: list[str] = []
    after: list[str] = []
    for _ in range(5):
        r = CliRunner().invoke(main, ["jobs", str(directory), "list", "--limit", "2", "--json", *after])
        assert r.exit_code == 0, r.output
        lines = [json.loads(line) for line in r.output.splitlines()]
        seen += [line["id"] for line in lines if "id" in line]
        cursors = [line["next"] for line in lines if "next" in line]
        assert all("next" in line for line in lines[2:]) and len(cursors) <= 1
        if not cursors:
            break
        after = ["--after", cursors[0]]
    assert seen == sorted(ids, reverse=True)


# contract: JOB-02
async def test_reads_of_a_queue_answer_while_its_jobs_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # after a restart every call of a big queue waited for the load of its jobs: a web page polling one job hung
    # 3.4 s (180,000 jobs). Reads of its rows, and the open, now answer at once; what needs the index waits
    from tinystore.engines.jobs import JobsEngine

    directory = tmp_path / "s"
    async with open_store("embedded", directory) as store:
        q = store.queue("big", keep="1h")
        ids = await q.add_many([{"n": n} for n in range(20)], tenant="t")

    release = asyncio.Event()
    load = JobsEngine._load_jobs

    async def slow_load(self: JobsEngine, q: Any, db: Any) -> None:
        await release.wait()
        await load(self, q, db)

    monkeypatch.setattr(JobsEngine, "_load_jobs", slow_load)
    async with open_store("embedded", directory) as store:
        try:
            q = store.queue("big", keep="1h")
            async with asyncio.timeout(3):
                job = await q.get(ids[0])
                page = await q.list(state="queued", limit=5)
                options = await q.options()
            assert job is not None and job.state == "queued" and len(page.jobs) == 5 and page.next is not None
            assert options["keep"] == 3600
            (big,) = [s for s in (await store.status())["jobs"]["queues"] if s["queue"] == "big"]
            assert big["loading"] is True and big["queued"] is None  # (trial CB: it was missing while it loaded)
            added = asyncio.ensure_future(q.add({"n": 20}))
            await asyncio.sleep(0.3)
            assert not added.done()  # an add places the job in the index: it waits for the load
        finally:
            release.set()
        await added
        assert len((await q.list(limit=100)).jobs) == 21
        (big,) = [s for s in (await store.status())["jobs"]["queues"] if s["queue"] == "big"]
        assert big["loading"] is False and big["queued"] == 21


# contract: JOB-04
async def test_the_history_is_trimmed_in_the_write_of_the_attempt_that_passes_its_size(tmp_path: Path) -> None:
    # (trial CB) a trim that read the history, then wrote the newest 50 back, lost an attempt ending in between;
    # (trial CQ) one in a write after the attempt's let a read in between see 51. It is now part of the attempt's
    # own write: every read, made as soon as the attempt's end is answered, sees at most the newest 50, in order
    async with open_store("embedded", tmp_path / "s", clock=datetime(2030, 1, 1)) as store:
        q = store.queue("flaky", attempts=80, backoff=("1s", "1s"))
        jid = await q.add("x")
        long = "e" * 1_900  # (about 33 pass 64 KiB: from the 51st attempt on, each cuts the oldest)
        for n in range(1, 71):
            await store.clock.advance("1s")
            (c,) = await claim(store, "flaky")
            assert await report(store, "flaky", c, "error", error=f"boom {n}", traceback=long)
            job = await q.get(jid)
            assert job is not None and job.attempts == n
            kept = [e.attempt for e in job.errors]
            assert kept == list(range(max(1, n - len(kept) + 1), n + 1))  # the newest, in order, none missing
            assert len(kept) == min(n, 50), (n, len(kept))
            assert job.errors[-1].error == f"boom {n}" and job.errors[-1].traceback == long
        assert len(job.errors) == 50
