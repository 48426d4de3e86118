"""A job added while a worker waits is claimed in the same commit as its insert (the claim's write follows the insert
in one group commit), so it starts one fsync sooner; a job placed in the index that early and then not written
after all (an idempotency key another job holds, a failed insert, a failed commit) leaves no trace and takes no
slot."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore
import tinystore.engines.jobs as jobs_engine
import tinystore.engines.jobs_index as jobs_index
from tinystore.engines.sql import SqlDatabase

from ..helpers import open_store
from .util import START, claim, other_client, report, wait_state, wait_until


def _index(store: tinystore.Store, queue: str) -> Any:
    engine: Any = store._core.engines["jobs"]
    return engine.queues[queue]


async def _commits(store: tinystore.Store) -> int:
    status = await store.status()
    n: int = status["databases"]["tinystore-jobs"]["commits"]
    return n


async def _a_claim_waits(store: tinystore.Store, queue: str) -> bool:
    status = await store.status()
    waiting: int = sum(q["waiting_claims"] for q in status["jobs"]["queues"] if q["queue"] == queue)
    return waiting == 1


def _record_states(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(job id, state) of every state event the jobs engine publishes from now on, in order."""
    seen: list[tuple[str, str]] = []
    event = jobs_engine.JobsEngine._event

    def recorded(self: Any, q: Any, kind: str, jid: str, state: str, *rest: Any) -> None:
        if kind == "state":
            seen.append((jid, state))
        event(self, q, kind, jid, state, *rest)

    monkeypatch.setattr(jobs_engine.JobsEngine, "_event", recorded)
    return seen


# contract: JOB-03
@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_a_job_added_to_a_waiting_worker_is_claimed_in_the_commit_of_its_add(tmp_path: Path, mode: str) -> None:
    """The attempt is still counted (committed, ``running``, attempt 1) before the handler starts, and the job's
    events still come in order: queued, running, succeeded."""
    async with open_store(mode, tmp_path / "s") as store:
        q = store.queue("idle")
        warm = await q.add({"warm": True})  # the jobs database exists, and a first job ran
        started: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
        go = asyncio.Event()

        async def handler(value: Any, run: Any) -> str:
            if value.get("warm"):
                return "warm"
            await started.put((run.job_id, run.attempt))
            await go.wait()
            return "done"

        worker = q.work(handler, concurrency=1)
        try:
            await wait_until(lambda: _a_claim_waits(store, "idle"), what="the worker waits for a job")
            await wait_state(q, warm, "succeeded")  # (its end's commit, else counted below on a slow machine)
            before = await _commits(store)
            jid = await q.add({"n": 1})
            got, attempt = await asyncio.wait_for(started.get(), 10)
            assert (got, attempt) == (jid, 1)
            # one commit wrote the row and claimed it: the add's and the claim's writes went together
            assert await _commits(store) - before == 1
            job = await q.get(jid)
            assert job is not None and (job.state, job.attempts) == ("running", 1)
            events: list[Any] = []
            watching = asyncio.ensure_future(_collect(q, jid, events))
            await asyncio.sleep(0.05)
            go.set()
            job = await wait_state(q, jid, "succeeded")
            assert job.result == "done"
            await asyncio.wait_for(watching, 10)
        finally:
            await worker.stop()


async def _collect(q: tinystore.Queue[Any], jid: str, events: list[Any]) -> None:
    async for job in q.watch(jid):
        events.append(job.state)
        if job.state == "succeeded":
            return


# contract: JOB-10
async def test_the_events_of_a_job_claimed_with_its_add_come_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _record_states(monkeypatch)
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("ordered")
        worker = q.work(lambda value, run: None, concurrency=2)
        try:
            await wait_until(lambda: _a_claim_waits(store, "ordered"), what="the worker waits")
            ids = await asyncio.gather(*(q.add({"i": i}) for i in range(3)))
            for jid in ids:
                await wait_state(q, jid, "succeeded")
        finally:
            await worker.stop()
    for jid in ids:
        assert [s for j, s in seen if j == jid] == ["queued", "running", "succeeded"], seen


# contract: JOB-05
async def test_a_key_another_job_holds_leaves_no_job_behind_when_a_claim_was_waiting(tmp_path: Path) -> None:
    """The new row was placed in the index (and handed to the waiting claim) before the insert found that the key
    is taken: the claim finds no row, and the index keeps nothing of it."""
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("keys")
        held = await q.add({"first": True}, key="k", delay="1h")
        waiting = asyncio.ensure_future(claim(worker, "keys", wait=5.0))
        await wait_until(lambda: _a_claim_waits(store, "keys"), what="the claim waits")
        again = await q.add({"second": True}, key="k")
        assert again == held
        assert await asyncio.wait_for(waiting, 10) == []
        index = _index(store, "keys")
        assert list(index.entries) == [held]
        assert index.running_total == 0 and not index.running
        store.clock.advance("1h")
        ran: list[Any] = []
        assert await q.run_due(lambda value, run: ran.append(value)) == 1
        assert ran == [{"first": True}]
        assert [j.id for j in (await q.list()).jobs] == [held]


# contract: JOB-05
async def test_a_key_another_job_holds_leaves_no_job_behind_when_its_tenant_was_full(tmp_path: Path) -> None:
    """As above, for a job placed early that no claim took (its tenant at ``max_running_per_tenant``): it leaves
    its tenant's line."""
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("full", max_running_per_tenant=1)
        held = await q.add({"held": True}, key="k", tenant="a", delay="1h")
        busy = await q.add({"busy": True}, tenant="a")
        [c] = await claim(worker, "full")
        assert c.id == busy
        waiting = asyncio.ensure_future(claim(worker, "full", wait=1.0))
        await wait_until(lambda: _a_claim_waits(store, "full"), what="the claim waits")
        assert await q.add({"again": True}, key="k", tenant="a") == held
        index = _index(store, "full")
        assert set(index.entries) == {held, busy}
        assert await report(worker, "full", c)  # tenant a has room again: nothing of the refused add is there
        assert await asyncio.wait_for(waiting, 10) == []
        assert set(index.entries) == {held}
        assert index.running_total == 0


# contract: JOB-01
async def test_adds_whose_insert_failed_are_written_again_and_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two adds of one loop turn share an insert; when it fails, each is tried again alone. The jobs placed early
    for the waiting worker (and claimed with the failed insert) must not linger, nor run twice."""
    insert = jobs_engine.JobsEngine._insert
    fail = {"left": 1}

    def failing_once(rows: list[list[Any]]) -> tuple[str, list[Any]]:
        sql, params = insert(rows)
        if fail["left"] and len(rows) == 2:
            fail["left"] -= 1
            params = list(params)
            params[1] = None  # the first row's queue: NOT NULL fails the statement
        return sql, params

    monkeypatch.setattr(jobs_engine.JobsEngine, "_insert", staticmethod(failing_once))
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("retried")
        ran: list[tuple[Any, int]] = []

        async def handler(value: Any, run: Any) -> None:
            ran.append((value["i"], run.attempt))

        worker = q.work(handler, concurrency=2)
        try:
            await wait_until(lambda: _a_claim_waits(store, "retried"), what="the worker waits")
            ids = await asyncio.gather(q.add({"i": 1}), q.add({"i": 2}))
            assert fail["left"] == 0
            for jid in ids:
                job = await wait_state(q, jid, "succeeded")
                assert job.attempts == 1
            await asyncio.sleep(0.05)
            assert sorted(ran) == [(1, 1), (2, 1)]
            index = _index(store, "retried")
            assert not index.entries and index.running_total == 0
        finally:
            await worker.stop()


# contract: JOB-01
async def test_an_add_whose_commit_failed_leaves_nothing_and_the_next_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The insert and the claim that followed it in one commit both fail (a full disk): the add raises, the claim
    gets the error (or nothing), and the job placed early is gone rather than left ready for a row that does not
    exist."""
    write = SqlDatabase.write
    failing = {"on": False}

    def full_disk(self: SqlDatabase, sql: str, params: Any, *, own: bool = False) -> Any:
        if failing["on"] and self.name == "tinystore-jobs" and (sql.startswith("insert") or sql.startswith("update")):
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(tinystore.UnavailableError("database or disk is full"))
            return fut
        return write(self, sql, params, own=own)

    monkeypatch.setattr(SqlDatabase, "write", full_disk)
    async with open_store("embedded", tmp_path / "s") as store, other_client(store) as worker:
        q = store.queue("full")
        await q.add({"warm": True})
        [c] = await claim(worker, "full")
        assert await report(worker, "full", c)
        waiting = asyncio.ensure_future(claim(worker, "full", wait=5.0))
        await wait_until(lambda: _a_claim_waits(store, "full"), what="the claim waits")
        failing["on"] = True
        with pytest.raises(tinystore.UnavailableError):
            await q.add({"lost": True})
        failing["on"] = False
        try:  # the claim that took the job fails with the commit
            assert await asyncio.wait_for(waiting, 10) == []
        except tinystore.UnavailableError:
            pass
        index = _index(store, "full")
        assert not index.entries and index.running_total == 0
        # (a line may still hold the dropped entry until a worker passes it: it is no longer ready)
        assert not [x for prios in index.ready.values() for line in prios.values() for x in line if x.where == 0]
        assert [j.id for j in (await q.list()).jobs] == [c.id]
        jid = await q.add({"next": True})
        [c2] = await claim(worker, "full")
        assert (c2.id, c2.attempt) == (jid, 1)
        assert await report(worker, "full", c2)


def _index_served(store: tinystore.Store, queue: str) -> dict[str, int]:
    served: dict[str, int] = _index(store, queue).served
    return served


# contract: JOB-07
async def test_a_job_placed_early_and_not_written_takes_no_turn_and_the_claim_waits_on(tmp_path: Path) -> None:
    """Trial AB: the refused add (its key held by a delayed job) still moved its tenant's turn, so a tenant that never
    ran a job went behind another, and the waiting claim answered [] at once instead of waiting."""
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("turns")
        await q.add({"held": True}, key="k", tenant="a", delay="1h")
        waiting = asyncio.ensure_future(claim(worker, "turns", wait=5.0))
        await wait_until(lambda: _a_claim_waits(store, "turns"), what="the claim waits")
        await q.add({"refused": True}, key="k", tenant="b")
        await asyncio.sleep(0.1)
        assert not waiting.done()  # it waits on, for a job that is written
        assert _index_served(store, "turns") == {}
        c_job = await q.add({"t": "c"}, tenant="c")
        [got] = await asyncio.wait_for(waiting, 5)
        assert got.id == c_job
        # b and d never ran a job: by name, b first (b did not lose its turn to the refused add)
        b_job = await q.add({"t": "b"}, tenant="b")
        await q.add({"t": "d"}, tenant="d")
        [first] = await claim(worker, "turns")
        assert first.id == b_job


# contract: JOB-01
async def test_when_a_shared_insert_fails_the_waiting_claim_gets_the_job_written_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    insert = jobs_engine.JobsEngine._insert

    def poisoned(rows: list[list[Any]]) -> tuple[str, list[Any]]:
        sql, params = insert(rows)
        params = list(params)
        for i, r in enumerate(rows):
            if '"poison"' in r[7]:
                params[i * 10 + 1] = None  # its queue: NOT NULL fails the statement
        return sql, params

    monkeypatch.setattr(jobs_engine.JobsEngine, "_insert", staticmethod(poisoned))
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("shared")
        await q.options()  # (the queue exists)
        waiting = asyncio.ensure_future(claim(worker, "shared", n=2, wait=5.0))
        await wait_until(lambda: _a_claim_waits(store, "shared"), what="the claim waits")
        ok, bad = await asyncio.gather(
            q.add({"ok": 1}, tenant="b"), q.add({"poison": 1}, tenant="a"), return_exceptions=True
        )
        assert isinstance(bad, tinystore.TinystoreError) and isinstance(ok, str)
        got = await asyncio.wait_for(waiting, 5)
        assert [c.id for c in got] == [ok]
        assert set(_index_served(store, "shared")) == {"b"}  # a's add never ran: no turn taken


# contract: JOB-10
async def test_a_claim_write_that_fails_at_once_leaves_one_queued_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial AB: the claim that followed an insert failed before the insert was answered; its job was dropped as if
    never written, then indexed again by the insert's answer: two "queued" events."""
    seen = _record_states(monkeypatch)
    write = SqlDatabase.write
    fail = {"on": False}

    def refused(self: SqlDatabase, sql: str, params: Any, *, own: bool = False) -> Any:
        if fail["on"] and self.name == "tinystore-jobs" and sql.lstrip().lower().startswith("update"):
            fail["on"] = False
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(tinystore.UnavailableError("the claim's write failed"))
            return fut
        return write(self, sql, params, own=own)

    monkeypatch.setattr(SqlDatabase, "write", refused)
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("once")
        await q.options()  # (the queue exists)
        waiting = asyncio.ensure_future(claim(worker, "once", wait=5.0))
        await wait_until(lambda: _a_claim_waits(store, "once"), what="the claim waits")
        fail["on"] = True
        jid = await q.add({"n": 1})
        with pytest.raises(tinystore.UnavailableError):
            await asyncio.wait_for(waiting, 5)
        assert await q.run_due(lambda value, run: None) == 1
        assert [s for j, s in seen if j == jid] == ["queued", "running", "succeeded"]


# contract: JOB-07
async def test_served_stays_bounded_while_one_tenants_job_runs_for_hours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial AB: the turns of tenants served after one whose job still ran were all kept (its turn held the floor
    of what could be forgotten)."""
    monkeypatch.setattr(jobs_index, "COMPACT_MIN", 64)
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("long", lease="1h")
        await q.add({"long": True}, tenant="old")
        [held] = await claim(worker, "long")  # runs on for hours
        for i in range(6 * 64):
            await q.add({"i": i}, tenant=f"user-{i}")
            assert await q.run_due(lambda value, run: None) == 1
            assert len(_index_served(store, "long")) <= 2 * (64 + 2), i
        assert "old" in _index_served(store, "long")
        assert await report(worker, "long", held)
