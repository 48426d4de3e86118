"""The jobs engine's deadline heaps hold about what is still live: a delayed job added and cancelled, or an attempt that
ended, no longer stays in memory until its deadline (trial X: 20,000 delayed jobs added and cancelled with a 30-day
delay stayed in the server for 30 days; each claimed attempt's lease and ``expected`` deadlines stayed 30 s after
it ended)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

import tinystore
import tinystore.engines.jobs as jobs_engine
import tinystore.engines.jobs_index as jobs_index
from tinystore.clock import Clock
from tinystore.engines.jobs_index import COMPACT_MIN, Deadlines

from ..helpers import open_store
from .util import START, claim, other_client, report


# contract: JOB-01
async def test_items_that_no_longer_matter_are_dropped_and_the_live_ones_all_fire_in_order() -> None:
    clock = Clock(START)
    t0 = clock.now()
    dead: set[int] = set()
    fired: list[int] = []
    deadlines = Deadlines(clock, fired.append, lambda item: item not in dead)
    rng = random.Random(7)
    when = {i: t0 + rng.uniform(1, 100) for i in range(6 * COMPACT_MIN)}
    for i, at in when.items():
        deadlines.push(at, i)
        if i % 10:
            dead.add(i)  # nine in ten stop mattering (cancelled, ended) before their time
        assert len(deadlines) <= 2 * COMPACT_MIN, len(deadlines)
    clock.advance(101)
    live = [i for i in when if i not in dead]
    # every live item fired once, in the order of its time (the dead ones left may fire too: their on_due does
    # nothing, as before)
    assert [i for i in fired if i not in dead] == sorted(live, key=lambda i: when[i])
    assert len(fired) < len(when) // 2
    deadlines.close()
    clock.close()


# contract: JOB-09
async def test_delayed_jobs_added_and_cancelled_leave_nothing_behind(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("later")
        for i in range(3 * COMPACT_MIN):
            await q.cancel(await q.add({"i": i}, delay="30d"))
        kept = await q.add({"i": "kept"}, delay="1h")
        engine: Any = store._core.engines["jobs"]  # type: ignore[attr-defined]
        index = engine.queues["later"]
        assert len(index.delayed) <= 2 * COMPACT_MIN, len(index.delayed)
        ran: list[Any] = []
        store.clock.advance("1h")
        assert await q.run_due(lambda value, run: ran.append(value)) == 1
        assert ran == [{"i": "kept"}]
        assert (await q.get(kept)).state == "succeeded"


# contract: JOB-08
async def test_ended_attempts_leave_their_lease_and_expected_deadlines(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("quick")
        await q.add_many([{"i": i} for i in range(3 * COMPACT_MIN)])
        ran = await q.run_due(lambda value, run: None)
        assert ran == 3 * COMPACT_MIN
        engine: Any = store._core.engines["jobs"]  # type: ignore[attr-defined]
        index = engine.queues["quick"]
        assert len(index.leases) <= 2 * COMPACT_MIN, len(index.leases)
        assert len(index.stuck_at) <= 2 * COMPACT_MIN, len(index.stuck_at)


# contract: JOB-09
async def test_due_jobs_cancelled_behind_a_waiting_one_leave_nothing_behind(tmp_path: Path) -> None:
    """Due jobs leave their tenant's line lazily, as a worker passes them: with no worker, jobs added and cancelled
    behind one that waits stayed in the line (and their priorities' keys in the heap of tenants) for good."""
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("due")
        first = await q.add({"i": "first"}, tenant="t")
        for i in range(4 * COMPACT_MIN):
            # the most behind "first" in its line; one in four at a higher priority, changing the tenant's key
            await q.cancel(await q.add({"i": i}, tenant="t", priority=2 if i % 4 == 0 else 0))
        last = await q.add({"i": "last"}, tenant="u", priority=1)
        engine: Any = store._core.engines["jobs"]  # type: ignore[attr-defined]
        index = engine.queues["due"]
        in_lines = sum(len(line) for prios in index.ready.values() for line in prios.values())
        assert in_lines <= COMPACT_MIN + 2, in_lines
        assert len(index.tenants) <= COMPACT_MIN + 2, len(index.tenants)
        ran: list[Any] = []
        assert await q.run_due(lambda value, run: ran.append(value)) == 2
        assert ran == [{"i": "last"}, {"i": "first"}]  # the higher priority first
        assert (await q.get(first)).state == (await q.get(last)).state == "succeeded"


# contract: JOB-08
@pytest.mark.parametrize("meanwhile", ["compaction", "lease due"])
async def test_an_attempt_whose_end_failed_keeps_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """While an attempt's end is being written, its deadlines were dropped as no longer running (by a compaction,
    or by its lease coming due then); should the write fail, the attempt runs on, and its lease must still end it
    when its worker is gone (trial Y: the job stayed running for good)."""
    if meanwhile == "compaction":
        monkeypatch.setattr(jobs_index, "COMPACT_MIN", 4)  # compactions at once
    failing: dict[str, Any] = {}
    write_ending = jobs_engine.JobsEngine._write_ending

    def held_then_failed(self: Any, q: Any, values: list[Any]) -> Any:
        if values[0] == failing.get("id") and "fut" not in failing:
            failing["fut"] = self.loop.create_future()
            return failing["fut"]
        return write_ending(self, q, values)

    monkeypatch.setattr(jobs_engine.JobsEngine, "_write_ending", held_then_failed)
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("lq", lease="30s", expected="60s")
        x = await q.add({"x": 1})
        await q.add_many([{"i": i} for i in range(8)])
        [cx] = await claim(worker, "lq")
        failing["id"] = cx.id
        ending = asyncio.ensure_future(report(worker, "lq", cx))
        while "fut" not in failing:
            await asyncio.sleep(0.01)
        if meanwhile == "compaction":
            for _ in range(8):  # other attempts claimed and ended: their deadlines fill the heaps, which compact
                [c] = await claim(worker, "lq")
                assert await report(worker, "lq", c)
        else:
            store.clock.advance("40s")  # x's lease comes due while its end is being written
            await asyncio.sleep(0.05)
        failing["fut"].set_exception(tinystore.UnavailableError("database or disk is full"))
        with pytest.raises(tinystore.UnavailableError):
            await ending
        # x's worker is gone: past its lease, x is failed as "worker lost" (to be retried)
        for _ in range(4):
            store.clock.advance("10s")
            await asyncio.sleep(0.05)
        job = await q.get(x)
        assert (job.state, job.error) == ("failed", "worker lost"), job


# contract: JOB-07
async def test_tenants_long_gone_are_forgotten_and_fairness_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When each tenant was last served is kept only while it can still matter (trial Z: one entry per tenant ever
    served stayed for good; with a user id as the tenant that grew without bound)."""
    monkeypatch.setattr(jobs_index, "COMPACT_MIN", 64)
    async with open_store("embedded", tmp_path / "s", clock=START) as store:
        q = store.queue("users")
        for i in range(5 * 64):
            await q.add({"i": i}, tenant=f"user-{i}")
        assert await q.run_due(lambda value, run: None) == 5 * 64
        engine: Any = store._core.engines["jobs"]
        index = engine.queues["users"]
        assert len(index.served) <= 2 * 64, len(index.served)

        # fairness after forgetting: "recent" was served last; then a backlog of "a" (never served), a job of
        # "user-0" (served first of all, forgotten) and one of "recent". The two served least recently, "a" and
        # "user-0", go first (by name, as tenants never served do), then "recent", then the rest of "a"
        await q.add({"t": "recent"}, tenant="recent")
        assert await q.run_due(lambda value, run: None) == 1
        await q.add_many([{"t": "a", "n": n} for n in range(3)], tenant="a")
        await q.add({"t": "user-0"}, tenant="user-0")
        await q.add({"t": "recent"}, tenant="recent")
        order: list[str] = []
        assert await q.run_due(lambda value, run: order.append(value["t"]), concurrency=1) == 5
        assert order == ["a", "user-0", "recent", "a", "a"], order


# contract: JOB-08
async def test_the_claims_kept_for_lost_answers_are_capped_by_their_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims are remembered for a while in case their answer is lost (then they are handed back); a claim may hold
    up to 1,000 attempts, so the cap counts attempts too (trial Z: 10,000 claims could keep 10 million)."""
    monkeypatch.setattr(jobs_engine, "CLAIMED_KEPT", 10)
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("many")
        await q.add_many([{"i": i} for i in range(40)])
        engine: Any = store._core.engines["jobs"]
        for _ in range(10):
            assert len(await claim(worker, "many", n=4)) == 4
            status = (await store.status())["jobs"]
            assert status["claimed_attempts_kept"] <= 10, status
        assert status["claimed_attempts_kept"] == 8 and status["claims_kept"] == 2
        assert sum(len(a) for _, a in engine._claims.values()) == 8


# contract: JOB-08
async def test_the_claims_kept_are_forgotten_when_kept_long_enough_with_no_new_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept claims were dropped only when a new claim came (trial EM: an idle store kept its last 8,958 for more
    than the 5 minutes it keeps them)."""
    monkeypatch.setattr(jobs_engine, "CLAIM_KEPT_FOR", 0.2)
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as worker:
        q = store.queue("idle")
        await q.add_many([{"i": i} for i in range(6)])
        for _ in range(3):
            assert len(await claim(worker, "idle", n=2)) == 2
        assert (await store.status())["jobs"]["claims_kept"] == 3
        async with asyncio.timeout(5):
            while (status := (await store.status())["jobs"])["claims_kept"]:
                await asyncio.sleep(0.05)
        assert status["claimed_attempts_kept"] == 0
