"""Trial GV (a job-queue veteran's checks): a queue's database that does not exist is refused at its first open,
not kept for good; a value that no longer decodes as the worker's type is a failed attempt, retried; run.cancelled
is set whenever the handler must stop; an async generator function is refused as a handler."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store
from tests.jobs.util import START


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_queue_whose_database_does_not_exist_is_refused_and_not_kept(tmp_path: Path, mode: str) -> None:
    # `database="ap"` for "app": the queue was kept in "ap" for good, every later open refused
    async with open_store(mode, tmp_path / "s") as store:
        app = await store.database("app")
        with pytest.raises(tinystore.InvalidError, match=r"queue mail: option database: there is no database ap"):
            await store.queue("mail", dict, database="ap").options()
        q = store.queue("mail", dict, database=app)
        job = await q.add({"to": "a@example.com"})
        assert (await q.get(job)) is not None
        # the default database is never refused
        assert await store.queue("other", dict).add({}) is not None


@dataclasses.dataclass
class IngestV1:
    doc_id: str


@dataclasses.dataclass
class IngestV2:
    doc_id: str
    version: int


async def test_a_value_that_no_longer_decodes_is_a_failed_attempt_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a deploy's new type: the old jobs ended dead at once, before any old worker could run them
    caplog.set_level(logging.INFO, "tinystore.jobs")
    store = await tinystore.open(tmp_path / "s", embedded=True, clock=START)
    try:
        old = store.queue("ingest", IngestV1, attempts=3)
        job = await old.add(IngestV1("d-17"))
        new = store.queue("ingest", IngestV2, attempts=3)
        assert await new.run_due(lambda v, run: "ran") == 1
        got = await new.get(job)
        assert got is not None and (got.state, got.attempts) == ("failed", 1)
        assert got.error is not None and "does not decode as IngestV2" in got.error
        assert "attempt 1 failed: queue ingest: the job's value does not decode as IngestV2" in caplog.text  # (HD)
        store.clock.advance("1h")
        assert await old.run_due(lambda v, run: v.doc_id) == 1  # an old worker takes it
        got = await old.get(job)
        assert got is not None and (got.state, got.result) == ("succeeded", "d-17")
    finally:
        await store.close()


async def test_run_cancelled_is_set_at_a_timeout_and_at_a_workers_stop(tmp_path: Path) -> None:
    # a handler that checks run.cancelled (in a thread, say) was never told at these two
    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:
        q = store.queue("q", dict, timeout="1s")
        seen: dict[str, bool] = {}
        started = asyncio.Event()

        async def handler(value: dict[str, str], run: tinystore.Run) -> None:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen[value["n"]] = run.cancelled.is_set()
                raise

        await q.add({"n": "timeout"})
        worker = q.work(handler)
        await asyncio.wait_for(started.wait(), 10)
        for _ in range(300):
            if "timeout" in seen:
                break
            await asyncio.sleep(0.01)
        started.clear()
        await q.add({"n": "stop"})
        await asyncio.wait_for(started.wait(), 10)
        await worker.stop()
        assert seen == {"timeout": True, "stop": True}
    finally:
        await store.close()


async def test_an_async_generator_function_is_refused_as_a_handler(tmp_path: Path) -> None:
    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:
        q = store.queue("q", dict)

        async def handler(value: dict[str, str], run: tinystore.Run):  # type: ignore[no-untyped-def]
            yield 1

        with pytest.raises(tinystore.InvalidError, match="async generator"):
            q.work(handler)
        with pytest.raises(tinystore.InvalidError, match="async generator"):
            await q.run_due(handler)
    finally:
        await store.close()


async def test_a_queue_opened_while_its_database_is_made_and_fails_is_refused(tmp_path: Path) -> None:
    # trial GX: the file was there while a failing first open ran, so the queue was kept, bound to a database the
    # failed open then removed
    slow_failing = (
        "001.sql",
        "create table big (v); insert into big with recursive c(x) as (select 1 union all select x + 1 from c "
        "where x < 300000) select x from c; insert into nosuch values (1)",
    )
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        opening = asyncio.ensure_future(store.database("app", migrations=[slow_failing]))
        path = tmp_path / "s" / "sql" / "app.db"
        for _ in range(2000):
            if path.exists():
                break
            await asyncio.sleep(0.001)
        with pytest.raises(tinystore.InvalidError, match="queue mail: option database: there is no database app"):
            await store.queue("mail", dict, database="app").options()
        with pytest.raises(tinystore.InvalidError, match="no such table: nosuch"):
            await opening
        app = await store.database("app")
        assert await store.queue("mail", dict, database=app).add({}) is not None
    finally:
        await store.close()


async def test_a_callable_object_whose_call_is_an_async_generator_is_refused(tmp_path: Path) -> None:
    class Handler:
        async def __call__(self, value: dict[str, str], run: tinystore.Run):  # type: ignore[no-untyped-def]
            yield 1

    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:
        with pytest.raises(tinystore.InvalidError, match="async generator"):
            store.queue("q", dict).work(Handler())
    finally:
        await store.close()
