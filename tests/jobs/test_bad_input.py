"""Bad input to the jobs engine: a clear error naming the queue (and the job), nothing half-written."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError, LimitError
from tinystore.protocol.jobs import Add, NewJob

from ..helpers import open_store


@dataclasses.dataclass
class Ask:
    chat_id: int


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


async def test_values_that_do_not_encode_or_are_too_big(store: tinystore.Store) -> None:
    q = store.queue("asks", Ask)
    with pytest.raises(InvalidError, match=r"queue asks: add: the value does not encode as Ask"):
        await q.add({"chat_id": "seven"})  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="queue asks"):
        await q.add(object())  # type: ignore[arg-type]
    plain = store.queue("plain")
    with pytest.raises(LimitError, match="queue plain") as info:
        await plain.add({"blob": "x" * (1024 * 1024)})
    assert info.value.limit == 1024 * 1024
    with pytest.raises(InvalidError, match="job 2"):
        await q.add_many([Ask(1), {"chat_id": None}, Ask(3)])  # type: ignore[list-item]
    assert (await q.list()).jobs == [] and (await plain.list()).jobs == []


async def test_bad_keys_delays_and_fields(store: tinystore.Store) -> None:
    q = store.queue("asks", Ask)
    for key in ("", "k" * 513):
        with pytest.raises(InvalidError, match="key"):
            await q.add(Ask(1), key=key)
    for delay in (-1, timedelta(seconds=-5), "-1s"):
        with pytest.raises(InvalidError, match=r"delay|duration"):
            await q.add(Ask(1), delay=delay)
    with pytest.raises(InvalidError, match="delay or at"):
        await q.add(Ask(1), delay="1s", at=0.0)
    with pytest.raises(InvalidError, match="priority"):
        await q.add(Ask(1), priority="high")  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="tenant"):
        await q.add(Ask(1), tenant="t" * 300)
    with pytest.raises(InvalidError, match="3 keys for 2 values"):
        await q.add_many([Ask(1), Ask(2)], keys=["a", "b", "c"])
    assert (await q.list()).jobs == []


async def test_bad_names_and_options(store: tinystore.Store) -> None:
    with pytest.raises(InvalidError, match="queue name"):
        store.queue("Bad Name")
    with pytest.raises(InvalidError, match="attempts"):
        await store.queue("q1", attempts=0).add({})
    with pytest.raises(InvalidError, match="lease"):
        await store.queue("q2", lease="100ms").add({})
    with pytest.raises(InvalidError, match="backoff"):
        await store.queue("q3", backoff=("1m", "1s")).add({})
    with pytest.raises(InvalidError, match="duration"):
        store.queue("q4", timeout="soon")
    with pytest.raises(InvalidError, match="concurrency"):
        store.queue("q5").work(lambda v, run: None, concurrency=0)
    await store.queue("q6", attempts=2).add({})
    with pytest.raises(InvalidError, match=r"queue q6: option attempts is 3 here but the store keeps 2"):
        await store.queue("q6", attempts=3).add({})
    assert len((await store.queue("q6").list()).jobs) == 1


async def test_a_raw_add_with_a_value_that_is_not_json_is_refused_by_the_server(store: tinystore.Store) -> None:
    await store.queue("raw").add({"ok": 1})
    with pytest.raises(InvalidError, match="not JSON"):
        await store._call("jobs.add", Add(queue="raw", jobs=[NewJob(value="{nope")]), list[str], write=True)
    with pytest.raises(InvalidError, match="negative"):
        await store._call("jobs.add", Add(queue="raw", jobs=[NewJob(value="1", delay_ms=-5)]), list[str], write=True)
    assert len((await store.queue("raw").list()).jobs) == 1


async def test_a_result_that_is_not_json_fails_the_attempt_with_a_clear_error(store: tinystore.Store) -> None:
    q = store.queue("results", attempts=1)
    jid = await q.add({})
    big = await q.add({"big": True})

    async def handler(value: Any, run: tinystore.Run) -> Any:
        if value.get("big"):
            return "x" * (1024 * 1024 + 1)
        return object()

    assert await q.run_due(handler) == 2
    job = await q.get(jid)
    assert job is not None and job.state == "dead" and job.result is None
    assert job.error is not None and f"queue results: job {jid}: the result does not encode as JSON" in job.error
    job = await q.get(big)
    assert job is not None and job.state == "dead" and "over the 1048576 bytes" in (job.error or "")


async def test_progress_and_steps_that_are_not_json_or_too_big(store: tinystore.Store) -> None:
    q = store.queue("progress", attempts=1)
    jid = await q.add({})
    errors: list[str] = []

    async def handler(value: Any, run: tinystore.Run) -> str:
        with pytest.raises(LimitError, match=f"job {run.job_id}"):
            run.set_progress({"x": "y" * 5000})
        with pytest.raises(InvalidError):
            run.set_progress(object())
        with pytest.raises(InvalidError, match="step"):
            await run.step("s", lambda: object())
        with pytest.raises(InvalidError, match="step name"):
            await run.step('a"b', lambda: 1)
        errors.append("checked")
        return "ok"

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert errors == ["checked"] and job is not None and job.state == "succeeded" and job.steps == {}


async def test_a_step_inside_a_transaction_of_the_queues_database_is_refused(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("001.sql", "create table t (id integer primary key);")])
    q = store.queue("in-tx", database=db)
    jid = await q.add({})
    seen: list[str] = []

    async def handler(value: Any, run: tinystore.Run) -> str:
        async def inside(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (id) values (1)")
            with pytest.raises(InvalidError, match="would wait for itself"):
                await run.step("s", lambda: 1)
            seen.append("refused")

        await db.tx(inside)
        return str(await run.step("s", lambda: 2))  # outside the transaction it works

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert (
        seen == ["refused"] and job is not None and (job.state, job.result, job.steps) == ("succeeded", "2", {"s": 2})
    )
