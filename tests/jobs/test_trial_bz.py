"""From trial BZ (a new user's thumbnailing app): reads of a queue whose first use is inside a transaction of its
own database, a step name used twice in one attempt, a handler's traceback."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store
from .util import wait_state


@pytest.fixture(params=["embedded", "private", "tcp"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


# contract: JOB-06
async def test_reads_of_a_queue_first_used_inside_a_transaction_answer_in_it(store: tinystore.Store) -> None:
    # the queue's tables were made by the transaction's own add; the reads waited for the making of the rest of
    # its schema, which queued behind the transaction on the writer: db.tx rolled back at tx_idle, the row lost
    db = await store.database("app", migrations=[("1.sql", "create table images (id integer primary key, job text)")])
    q = store.queue("thumbs", database=db)
    seen: dict[str, Any] = {}

    async def upload(tx: Any) -> str:
        jid = await tx.with_(q).add({"image": 1}, key="thumb/1")
        await tx.exec("insert into images (job) values (?)", jid)
        async with asyncio.timeout(3):
            seen["get"] = await q.get(jid)  # a read outside the transaction: it does not see the add
            seen["list"] = (await q.list()).jobs
            seen["status"] = (await store.status())["jobs"]
        return jid

    jid = await db.tx(upload)
    assert (seen["get"], seen["list"]) == (None, [])
    assert await db.scalar("select count(*) from images") == 1
    job = await q.get(jid)
    assert job is not None and job.state == "queued"


# contract: JOB-12
async def test_a_step_name_used_twice_in_one_attempt_is_refused(store: tinystore.Store) -> None:
    # a loop of steps under one name returned the first round's result for every round, and the job succeeded
    q = store.queue("fetches", backoff=("10ms", "10ms"))
    calls: list[str] = []

    async def handler(urls: list[str], run: tinystore.Run) -> list[Any]:
        out = []
        for url in urls:
            out.append(await run.step("fetch", lambda url=url: calls.append(url) or f"body of {url}"))
        return out

    worker = q.work(handler)
    try:
        jid = await q.add(["a", "b"])
        job = await wait_state(q, jid, "dead", "failed", "succeeded")
    finally:
        await worker.stop()
    assert job.state != "succeeded"
    assert job.error is not None and "InvalidError" in job.error and "'fetch'" in job.error, job.error
    assert "already" in job.error
    assert calls == ["a"]  # (round one ran once, and was refused its second round)

    # a name of its own for each round, and a step that raised, called again: as documented
    async def rounds(urls: list[str], run: tinystore.Run) -> list[Any]:
        out = []
        for url in urls:
            out.append(await run.step(f"fetch:{url}", lambda url=url: f"body of {url}"))
        try:
            await run.step("flaky", lambda: 1 / 0)
        except ZeroDivisionError:
            out.append(await run.step("flaky", lambda: "second try"))
        return out

    q2 = store.queue("rounds")
    worker = q2.work(rounds)
    try:
        jid = await q2.add(["a", "b"])
        job = await wait_state(q2, jid, "succeeded", "dead")
    finally:
        await worker.stop()
    assert job.state == "succeeded", job.error
    assert job.result == ["body of a", "body of b", "second try"]


# contract: JOB-02
async def test_a_failed_attempt_is_logged_with_its_traceback(
    store: tinystore.Store, caplog: pytest.LogCaptureFixture
) -> None:
    q = store.queue("thumbs", attempts=1)

    def resize(spec: dict[str, Any]) -> int:
        return int(spec["width"])

    async def handler(spec: dict[str, Any], run: tinystore.Run) -> int:
        return resize(spec)

    caplog.set_level(logging.INFO, logger="tinystore.jobs")
    worker = q.work(handler)
    try:
        jid = await q.add({"height": 3})
        job = await wait_state(q, jid, "dead")
    finally:
        await worker.stop()
    assert job.error == "KeyError: 'width'"
    failed = [r for r in caplog.records if "attempt 1 failed" in r.getMessage()]
    assert failed and failed[0].exc_info is not None
    assert "in resize" in caplog.text  # where it was raised
    # from the handler's frame on, as the job keeps it (trial FG: the log began with a frame of the SDK)
    logged = caplog.text[caplog.text.index("Traceback") :]
    assert "tinystore/client/jobs.py" not in logged and "in handler" in logged, logged


# contract: JOB-02
async def test_a_tenant_not_given_reads_back_as_none_like_user_and_type(store: tinystore.Store) -> None:
    q = store.queue("plain")
    jid = await q.add(1)
    job = await q.get(jid)
    assert job is not None and (job.tenant, job.user, job.type, job.key) == (None, None, None, None)
    seen: list[Any] = []

    async def handler(value: int, run: tinystore.Run) -> None:
        seen.append(run.tenant)

    await q.run_due(handler)
    assert seen == [None]
    jid = await q.add(2, tenant="org-7")
    assert (await q.get(jid)).tenant == "org-7"  # type: ignore[union-attr]


# contract: JOB-01
@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
async def test_a_queue_first_used_by_a_worker_and_a_transaction_at_once_does_not_wait_for_tx_idle(
    tmp_path: Path, mode: str
) -> None:
    """CI (after trial EL's fix, which had an admin's first call of a queue wait for its jobs tables): the chat's
    worker opened the queue as a post's transaction began; the transaction's first call of the queue shared that
    open, which waited for tables queued behind the transaction itself, until tx_idle (the post answered 500)."""
    async with open_store(mode, tmp_path / "s") as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (x)")])
        q = store.queue("replies", database=db)
        ran = asyncio.Event()

        async def handler(value: Any, run: tinystore.Run) -> None:
            ran.set()

        async def post(tx: tinystore.SqlTx) -> str:
            await tx.exec("insert into t values (1)")
            return await tx.with_(q).add({"n": 1})

        worker = q.work(handler)
        try:
            listing = asyncio.ensure_future(q.list(limit=1))  # its call opens the queue...
            await asyncio.sleep(0)
            async with asyncio.timeout(4):  # (tx_idle: 5 s)
                job_id = await db.tx(post)  # ...as this transaction begins and adds
                await listing
                await ran.wait()
            assert (await q.get(job_id)) is not None
        finally:
            await worker.stop()
