"""The locks engine alone: leases, waiters, fences and deadlines, in fake time (no sockets, no sleeping)."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tinystore.clock import Clock, Timer
from tinystore.engines.locks import LocksEngine
from tinystore.errors import ClosedError, InUseError, InvalidError, LostError
from tinystore.limits import Limits
from tinystore.protocol import locks as proto
from tinystore.protocol.locks import Grant, Lost

EPOCH = 1_893_456_000_000  # 2030-01-01 in ms
START = datetime(2030, 1, 1)
_peer_ids = itertools.count(1)


class FakePeer:
    """A Peer that records every push (also ones to a closed peer, so tests can see there were none)."""

    def __init__(self, local: bool = False) -> None:
        self.id = next(_peer_ids)
        self.local = local
        self.closed = False
        self.pushes: list[tuple[str, Any]] = []

    def push(self, method: str, body: Any) -> None:
        self.pushes.append((method, body))

    def lost(self) -> list[Lost]:
        return [body for method, body in self.pushes if method == proto.LOST]


class TimerlessClock(Clock):
    """A test clock whose timers never fire: the engine must see a passed deadline before its timer runs."""

    def call_at(self, when: float, callback: Any) -> Timer:
        return Timer(when, callback)


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock(START)
    yield c
    c.close()


@pytest.fixture
async def engine(clock: Clock) -> AsyncIterator[LocksEngine]:
    e = LocksEngine(clock, Limits(), EPOCH)
    yield e
    e.close()


async def settle(turns: int = 5) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def holders(engine: LocksEngine, lock: str, key: str) -> list[dict[str, Any]]:
    for entry in engine.status()["keys"]:
        if entry["lock"] == lock and entry["key"] == key:
            return list(entry["leases"])
    return []


def waiting(engine: LocksEngine, lock: str, key: str) -> int:
    for entry in engine.status()["keys"]:
        if entry["lock"] == lock and entry["key"] == key:
            return int(entry["waiters"])
    return 0


def empty(engine: LocksEngine) -> bool:
    stats = engine.statistics()
    return all(stats[k] == 0 for k in ("locks", "keys", "leases", "waiters", "heap", "armed"))


async def take(
    engine: LocksEngine,
    peer: FakePeer,
    key: str = "7",
    *,
    lock: str = "summaries",
    limit: int = 1,
    ttl: float = 10.0,
    max_hold: float | None = None,
    wait: float | None = None,
) -> Grant | None:
    return await engine.acquire(peer, lock, key, limit=limit, ttl=ttl, max_hold=max_hold, wait=wait)


async def must_take(engine: LocksEngine, peer: FakePeer, key: str = "7", **kw: Any) -> Grant:
    grant = await take(engine, peer, key, **kw)
    assert grant is not None
    return grant


# ---------------------------------------------------------------- LOCK-01


# contract: LOCK-01
async def test_a_lock_has_one_holder(engine: LocksEngine) -> None:
    a, b = FakePeer(), FakePeer()
    grant = await must_take(engine, a)
    assert await take(engine, b) is None
    assert [h["peer"] for h in holders(engine, "summaries", "7")] == [a.id]
    assert engine.release(a, grant.lease) is True
    assert await take(engine, b) is not None


# contract: LOCK-01
async def test_a_semaphore_has_at_most_limit_holders(engine: LocksEngine) -> None:
    peers = [FakePeer() for _ in range(4)]
    grants = [await take(engine, p, "r", lock="renders", limit=3) for p in peers]
    assert [g is not None for g in grants] == [True, True, True, False]
    assert len(holders(engine, "renders", "r")) == 3
    first = grants[0]
    assert first is not None
    engine.release(peers[0], first.lease)
    assert await take(engine, peers[3], "r", lock="renders", limit=3) is not None
    assert len(holders(engine, "renders", "r")) == 3


# contract: LOCK-01
async def test_keys_and_locks_are_independent(engine: LocksEngine) -> None:
    p = FakePeer()
    assert await take(engine, p, "7") is not None
    assert await take(engine, p, "8") is not None
    assert await take(engine, p, "7", lock="other") is not None
    assert await take(engine, p, "7") is None


# contract: LOCK-01
async def test_a_limit_below_one_or_above_the_largest_is_invalid(engine: LocksEngine) -> None:
    # (the engine checks what a connection sends as the SDK does: 1 to LIMIT_MAX)
    for bad in (0, -1, 1_000_001, 2**40):
        with pytest.raises(InvalidError, match="limit"):
            await take(engine, FakePeer(), lock="renders", limit=bad)


# contract: LOCK-01
async def test_one_limit_per_key_while_it_is_in_use(engine: LocksEngine) -> None:
    a = FakePeer()
    grant = await must_take(engine, a, "x", lock="renders", limit=3)
    with pytest.raises(InvalidError, match=r'lock renders: key "x": limit 1 differs from limit 3'):
        await take(engine, a, "x", lock="renders", limit=1)
    other = await must_take(engine, a, "y", lock="renders", limit=1)  # another key: its own limit
    engine.release(a, grant.lease)
    engine.release(a, other.lease)
    # nothing held or awaited any more: the key may come back with another limit
    assert await take(engine, a, "x", lock="renders", limit=1) is not None


# contract: LOCK-01
async def test_a_passed_deadline_frees_the_key_before_its_timer_runs() -> None:
    clock = TimerlessClock(START)
    engine = LocksEngine(clock, Limits(), EPOCH)
    a, b = FakePeer(), FakePeer()
    old = await must_take(engine, a, ttl=2)
    clock.advance(2.5)  # the timer never fires: the engine must see the deadline itself
    new = await must_take(engine, b, ttl=2)
    assert [lost.lease for lost in a.lost()] == [old.lease]
    assert engine.release(a, old.lease) is False
    assert [h["lease"] for h in holders(engine, "summaries", "7")] == [new.lease]
    engine.close()


# ---------------------------------------------------------------- LOCK-02


# contract: LOCK-02
async def test_fences_are_epoch_and_a_growing_counter(engine: LocksEngine) -> None:
    p, q = FakePeer(), FakePeer()
    grants = [await must_take(engine, p, key, lock="renders", limit=2) for key in ("a", "b", "a")]
    waiter = asyncio.create_task(take(engine, q, "a", lock="renders", limit=2, wait=5))
    await settle()
    grants.append(await must_take(engine, q, "b", lock="renders", limit=2))
    grants.append(await must_take(engine, p, "c", lock="renders", limit=2))
    engine.release(p, grants[-1].lease)
    engine.release(p, grants[0].lease)  # the waiter on "a" gets it
    granted = await waiter
    assert granted is not None
    fences = [g.fence for g in [*grants, granted]]
    assert fences == [EPOCH << 64 | n for n in range(1, 7)]
    assert fences == sorted(set(fences))
    assert all(f.bit_length() > 64 for f in fences)  # 128-bit ints
    texts = [f"{f:040d}" for f in fences]
    assert texts == sorted(texts) and all(len(t) == 40 for t in texts)


# contract: LOCK-02
async def test_fences_grow_across_restarts(clock: Clock) -> None:
    p = FakePeer()
    before = LocksEngine(clock, Limits(), EPOCH)
    last = 0
    for _ in range(1000):
        grant = await must_take(before, p)
        assert grant.fence > last
        last = grant.fence
        before.release(p, grant.lease)
    before.close()
    # the core persists the epoch and makes the next one max(now_ms, last + 1)
    after = LocksEngine(clock, Limits(), EPOCH + 1)
    assert (await must_take(after, p)).fence > last
    after.close()


def test_the_epoch_must_fit_64_bits(clock: Clock) -> None:
    for bad in (-1, 1 << 64, 1.5, True):
        with pytest.raises(InvalidError, match="epoch"):
            LocksEngine(clock, Limits(), bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- LOCK-03


# contract: LOCK-03
async def test_try_returns_at_once(engine: LocksEngine) -> None:
    a, b = FakePeer(), FakePeer()
    await must_take(engine, a)
    assert await take(engine, b, wait=None) is None
    assert waiting(engine, "summaries", "7") == 0


# contract: LOCK-03
async def test_hold_waits_first_come_first_served(engine: LocksEngine) -> None:
    holder = FakePeer()
    grant = await must_take(engine, holder)
    peers = [FakePeer() for _ in range(4)]
    tasks = []
    for p in peers:
        tasks.append(asyncio.create_task(take(engine, p, wait=60)))
        await settle()
    assert waiting(engine, "summaries", "7") == 4
    order = []
    current = grant
    for _ in peers:
        engine.release(holder, current.lease)
        await settle()
        done = [i for i, t in enumerate(tasks) if t.done() and i not in order]
        assert len(done) == 1
        order.append(done[0])
        result = tasks[done[0]].result()
        assert result is not None
        current = result
    assert order == [0, 1, 2, 3]


# contract: LOCK-03
async def test_hold_gives_up_after_the_wait(engine: LocksEngine, clock: Clock) -> None:
    a, b = FakePeer(), FakePeer()
    await must_take(engine, a)
    task = asyncio.create_task(take(engine, b, wait=0.5))
    await settle()
    clock.advance(0.4)
    await settle()
    assert not task.done()
    clock.advance(0.11)
    await settle()
    with pytest.raises(InUseError) as info:
        await task
    assert str(info.value) == 'lock summaries: key "7": held for all of the 0.5s wait'
    assert waiting(engine, "summaries", "7") == 0
    assert engine.statistics()["waiters"] == 0


# contract: LOCK-03
async def test_a_wait_of_zero_is_now_or_never(engine: LocksEngine) -> None:
    a, b = FakePeer(), FakePeer()
    assert await take(engine, a, wait=0) is not None
    with pytest.raises(InUseError, match=r'^lock summaries: key "7": held \(no wait\)$'):  # (trial BU: "all of the 0s")
        await take(engine, b, wait=0)
    assert waiting(engine, "summaries", "7") == 0


# contract: LOCK-03
async def test_a_semaphore_line_is_fifo_too(engine: LocksEngine) -> None:
    holders_ = [FakePeer(), FakePeer()]
    grants = [await must_take(engine, p, "k", lock="renders", limit=2) for p in holders_]
    tasks = []
    for _ in range(3):
        tasks.append(asyncio.create_task(take(engine, FakePeer(), "k", lock="renders", limit=2, wait=30)))
        await settle()
    engine.release(holders_[1], grants[1].lease)
    await settle()
    assert [t.done() for t in tasks] == [True, False, False]
    engine.release(holders_[0], grants[0].lease)
    await settle()
    assert [t.done() for t in tasks] == [True, True, False]


# ---------------------------------------------------------------- LOCK-04


# contract: LOCK-04
async def test_release_passes_the_key_in_the_same_turn_with_a_fresh_ttl(engine: LocksEngine, clock: Clock) -> None:
    a, b = FakePeer(), FakePeer()
    grant = await must_take(engine, a, ttl=10)
    task = asyncio.create_task(take(engine, b, ttl=10, wait=60))
    await settle()
    clock.advance(8)
    released_at = clock.now()
    assert engine.release(a, grant.lease) is True
    # no await in between: the waiter holds it already
    assert [h["peer"] for h in holders(engine, "summaries", "7")] == [b.id]
    granted = await task
    assert granted is not None
    assert granted.expires_at == pytest.approx(released_at + 10, abs=0.5)
    clock.advance(9)  # 17 s after the first grant, 9 s into the second: still held
    assert [h["peer"] for h in holders(engine, "summaries", "7")] == [b.id]
    assert b.lost() == []


# contract: LOCK-04
async def test_a_cancelled_waiter_leaves_the_line(engine: LocksEngine) -> None:
    a, b, c = FakePeer(), FakePeer(), FakePeer()
    grant = await must_take(engine, a)
    tb = asyncio.create_task(take(engine, b, wait=60))
    tc = asyncio.create_task(take(engine, c, wait=60))
    await settle()
    tb.cancel()
    await settle()
    assert tb.cancelled()
    assert waiting(engine, "summaries", "7") == 1
    engine.release(a, grant.lease)
    granted = await tc
    assert granted is not None
    assert [h["peer"] for h in holders(engine, "summaries", "7")] == [c.id]
    engine.release(c, granted.lease)
    assert empty(engine)


# contract: LOCK-04
async def test_a_cancel_in_the_turn_of_the_grant_lets_the_grant_go(engine: LocksEngine) -> None:
    a, b, c = FakePeer(), FakePeer(), FakePeer()
    grant = await must_take(engine, a)
    tb = asyncio.create_task(take(engine, b, wait=60))
    tc = asyncio.create_task(take(engine, c, wait=60))
    await settle()
    engine.release(a, grant.lease)  # b is granted now ...
    tb.cancel()  # ... and cancelled before its task runs again
    await settle()
    assert tb.cancelled()
    assert tc.done()  # b's grant went on to c at once: nothing leaked
    granted = tc.result()
    assert granted is not None
    assert [h["peer"] for h in holders(engine, "summaries", "7")] == [c.id]
    engine.release(c, granted.lease)
    assert empty(engine)


# contract: LOCK-04
async def test_a_dropped_peer_leaves_the_line_and_keeps_its_leases(engine: LocksEngine) -> None:
    a, b = FakePeer(), FakePeer()
    grant = await must_take(engine, a)
    await must_take(engine, b, "other")
    task = asyncio.create_task(take(engine, b, wait=60))
    await settle()
    b.closed = True
    engine.drop_peer(b)
    await settle()
    assert task.done()
    with pytest.raises(ClosedError, match="closed"):
        await task
    assert waiting(engine, "summaries", "7") == 0
    assert len(holders(engine, "summaries", "other")) == 1
    engine.release(a, grant.lease)
    assert holders(engine, "summaries", "7") == []


# ---------------------------------------------------------------- LOCK-05


# contract: LOCK-05
async def test_a_lease_runs_out_ttl_after_its_last_renewal(engine: LocksEngine, clock: Clock) -> None:
    a = FakePeer()
    grant = await must_take(engine, a, ttl=10)
    assert grant.expires_at == pytest.approx(clock.now() + 10, abs=0.5)
    for _ in range(5):
        clock.advance(8)
        expires_at = engine.renew(a, grant.lease)
        assert expires_at == pytest.approx(clock.now() + 10, abs=0.5)
    assert a.lost() == []
    clock.advance(10.01)
    assert holders(engine, "summaries", "7") == []
    [lost] = a.lost()
    assert (lost.lease, lost.reason, lost.lock, lost.key) == (grant.lease, "expired", "summaries", "7")
    assert lost.message.startswith('lock summaries: key "7": the lease ran out at 2030-01-01T00:00:50')


# contract: LOCK-05
async def test_a_run_out_lease_passes_on_and_is_never_renewed(engine: LocksEngine, clock: Clock) -> None:
    a, b = FakePeer(), FakePeer()
    old = await must_take(engine, a, ttl=2)
    task = asyncio.create_task(take(engine, b, ttl=2, wait=60))
    await settle()
    clock.advance(2.01)
    new = await task
    assert new is not None and new.fence > old.fence
    with pytest.raises(LostError) as info:
        engine.renew(a, old.lease)
    assert str(info.value).startswith('lock summaries: key "7": the lease ran out at 2030-01-01T00:00:02')
    # a late release changes nothing that b holds
    assert engine.release(a, old.lease) is False
    assert [h["lease"] for h in holders(engine, "summaries", "7")] == [new.lease]
    assert engine.renew(b, new.lease) > clock.now()


# contract: LOCK-05
async def test_a_renewal_past_the_deadline_is_refused_before_its_timer() -> None:
    clock = TimerlessClock(START)
    engine = LocksEngine(clock, Limits(), EPOCH)
    a = FakePeer()
    grant = await must_take(engine, a, ttl=2)
    clock.advance(2.01)
    with pytest.raises(LostError, match="ran out"):
        engine.renew(a, grant.lease)
    assert [lost.lease for lost in a.lost()] == [grant.lease]
    assert empty(engine)
    engine.close()


# contract: LOCK-05
async def test_lost_goes_to_the_peer_that_renewed_last(engine: LocksEngine, clock: Clock) -> None:
    old_conn, new_conn = FakePeer(), FakePeer()
    grant = await must_take(engine, old_conn, ttl=3)
    old_conn.closed = True  # the connection drops; the lease stays while its ttl lasts
    engine.drop_peer(old_conn)
    clock.advance(2)
    engine.renew(new_conn, grant.lease)  # the SDK reconnected and renews by id
    assert holders(engine, "summaries", "7")[0]["peer"] == new_conn.id
    clock.advance(3.01)
    assert old_conn.pushes == []
    assert [lost.lease for lost in new_conn.lost()] == [grant.lease]


# contract: LOCK-05
async def test_no_push_to_a_closed_peer(engine: LocksEngine, clock: Clock) -> None:
    a, b = FakePeer(), FakePeer()
    await must_take(engine, a, ttl=1)
    task = asyncio.create_task(take(engine, b, ttl=1, wait=60))
    await settle()
    a.closed = True
    clock.advance(1.01)
    assert a.pushes == []
    assert await task is not None  # the key still passes on


# contract: LOCK-05
async def test_a_local_lease_never_runs_out_by_ttl(engine: LocksEngine, clock: Clock) -> None:
    me = FakePeer(local=True)
    grant = await must_take(engine, me, ttl=1)
    assert grant.expires_at == math.inf
    assert engine.renew(me, grant.lease) == math.inf
    clock.advance(86400)
    assert [h["lease"] for h in holders(engine, "summaries", "7")] == [grant.lease]
    assert holders(engine, "summaries", "7")[0]["expires_at"] is None
    assert me.lost() == []
    assert engine.release(me, grant.lease) is True


# contract: LOCK-05
async def test_release_and_renew_go_by_lease_id_from_any_peer(engine: LocksEngine) -> None:
    a, b = FakePeer(), FakePeer()
    grant = await must_take(engine, a)
    engine.renew(b, grant.lease)
    assert engine.release(b, grant.lease) is True
    assert engine.release(a, grant.lease) is False
    with pytest.raises(LostError, match="not held"):
        engine.renew(a, grant.lease)


async def test_a_lease_of_an_earlier_run_is_unknown(clock: Clock) -> None:
    # the engine side of LOCK-07: a restart forgets every lease, and a renewal of one is refused
    p = FakePeer()
    before = LocksEngine(clock, Limits(), EPOCH)
    grant = await must_take(before, p)
    before.close()
    after = LocksEngine(clock, Limits(), EPOCH + 1)
    with pytest.raises(LostError, match="restarted"):
        after.renew(p, grant.lease)
    assert after.release(p, grant.lease) is False
    assert await take(after, FakePeer()) is not None
    after.close()


# ---------------------------------------------------------------- LOCK-06


# contract: LOCK-06
async def test_max_hold_ends_a_renewed_lease(engine: LocksEngine, clock: Clock) -> None:
    a = FakePeer()
    grant = await must_take(engine, a, ttl=3, max_hold=10)
    assert grant.max_hold_at is not None
    assert grant.max_hold_at == pytest.approx(clock.now() + 10, abs=0.5)
    for _ in range(3):
        clock.advance(2.9)
        assert engine.renew(a, grant.lease) <= grant.max_hold_at
    clock.advance(1.5)  # 10.2 s after the grant
    assert holders(engine, "summaries", "7") == []
    [lost] = a.lost()
    assert (lost.lease, lost.reason) == (grant.lease, "max_hold")
    with pytest.raises(LostError, match="max_hold of 10s"):
        engine.renew(a, grant.lease)


# contract: LOCK-06
async def test_max_hold_below_the_ttl_bounds_the_first_deadline(engine: LocksEngine, clock: Clock) -> None:
    a = FakePeer()
    grant = await must_take(engine, a, ttl=10, max_hold=4)
    assert grant.expires_at == grant.max_hold_at
    clock.advance(3)
    assert engine.renew(a, grant.lease) == grant.max_hold_at
    clock.advance(1.01)
    assert [(lost.lease, lost.reason) for lost in a.lost()] == [(grant.lease, "max_hold")]
    assert holders(engine, "summaries", "7") == []


# contract: LOCK-06
async def test_max_hold_ends_a_local_lease(engine: LocksEngine, clock: Clock) -> None:
    me, other = FakePeer(local=True), FakePeer()
    grant = await must_take(engine, me, max_hold=5)
    assert grant.expires_at == grant.max_hold_at
    task = asyncio.create_task(take(engine, other, wait=60))
    await settle()
    clock.advance(4.9)
    assert not task.done()
    clock.advance(0.2)
    assert await task is not None
    assert [(lost.lease, lost.reason) for lost in me.lost()] == [(grant.lease, "max_hold")]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ttl": 0.5}, 'lock summaries: key "7": ttl 0.5s is outside 1s .. 1h'),
        ({"ttl": 3601}, 'lock summaries: key "7": ttl 1h1s is outside 1s .. 1h'),
        ({"ttl": math.nan}, 'lock summaries: key "7": ttl nan must be a number of seconds in 1s .. 1h'),
        ({"ttl": math.inf}, 'lock summaries: key "7": ttl inf is outside 1s .. 1h'),
        ({"wait": math.nan}, 'lock summaries: key "7": wait nan'),
        ({"max_hold": math.inf}, 'lock summaries: key "7": max_hold inf'),
        ({"ttl": "30s"}, "lock summaries: key \"7\": ttl '30s' must be a number"),
        ({"wait": -1}, 'lock summaries: key "7": wait -1'),
        ({"max_hold": 0}, 'lock summaries: key "7": max_hold 0'),
        ({"max_hold": -3}, 'lock summaries: key "7": max_hold -3'),
        ({"limit": 0}, 'lock summaries: key "7": limit 0'),
        ({"key": 7}, "lock summaries: key 7: the engine takes a key as text"),
        ({"key": ""}, 'lock summaries: key "": a key is 1 to 256 characters'),
        ({"key": "x" * 257}, f'lock summaries: key "{"x" * 40}": a key is 1 to 256 characters'),
        ({"lock": "Summaries"}, "lock name 'Summaries'"),
        ({"lock": ""}, "lock name ''"),
    ],
)
async def test_bad_options_are_invalid(engine: LocksEngine, options: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"lock": "summaries", "key": "7", "ttl": 10, "max_hold": None, "wait": None}
    args.update(options)
    lock, key = args.pop("lock"), args.pop("key")
    with pytest.raises(InvalidError) as info:
        await engine.acquire(FakePeer(), lock, key, **args)
    assert str(info.value).startswith(message)
    assert empty(engine)


async def test_the_ttl_bounds_come_from_the_limits(clock: Clock) -> None:
    engine = LocksEngine(clock, Limits(lock_ttl_min=0.1, lock_ttl_max=5), EPOCH)
    assert await take(engine, FakePeer(), ttl=0.5) is not None
    with pytest.raises(InvalidError, match=r"ttl 6s is outside 0\.1s \.\. 5s"):
        await take(engine, FakePeer(), "8", ttl=6)
    engine.close()


# ---------------------------------------------------------------- leaks, status, close


async def test_many_cycles_leave_nothing_behind(engine: LocksEngine, clock: Clock) -> None:
    local, remote = FakePeer(local=True), FakePeer()
    for i in range(100_000):
        peer = remote if i % 2 else local
        grant = await must_take(engine, peer, str(i % 7), ttl=30, max_hold=60 if i % 3 == 0 else None)
        assert engine.release(peer, grant.lease) is True
    # a contended stretch: waiters that get the key, waiters that give up, waiters cancelled
    holder = await must_take(engine, remote, ttl=5)
    tasks = [asyncio.create_task(take(engine, FakePeer(), wait=w)) for w in (1, 60, 60, 2)]
    await settle()
    tasks[2].cancel()
    clock.advance(1.5)  # the first waiter gives up
    engine.release(remote, holder.lease)  # the second gets it
    await settle()
    second = tasks[1].result()
    assert second is not None
    engine.release(remote, second.lease)  # the fourth gets it
    await settle()
    fourth = tasks[3].result()
    assert fourth is not None
    engine.release(remote, fourth.lease)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], InUseError) and isinstance(results[2], asyncio.CancelledError)
    assert empty(engine), engine.statistics()
    assert engine.status() == {"epoch": EPOCH, "leases": 0, "waiters": 0, "keys_total": 0, "keys": []}


async def test_deadlines_hold_when_most_leases_are_released(engine: LocksEngine, clock: Clock) -> None:
    peer = FakePeer()
    t0 = clock.now()
    ttls = [5 + (i * 7) % 50 for i in range(1000)]  # 5 .. 54 s, in no order
    grants = [await must_take(engine, peer, str(i), ttl=ttls[i]) for i in range(1000)]
    kept = [i for i in range(1000) if i % 10 == 0]
    for i in range(1000):
        if i % 10:
            assert engine.release(peer, grants[i].lease) is True
    assert engine.statistics()["heap"] <= 4 * len(kept) + 1  # stale entries were compacted away
    renewed = {i for i in kept if i % 20 == 0}
    for i in renewed:
        engine.renew(peer, grants[i].lease)  # at once: their deadline moves by the little time passed
    for second in range(1, 60):
        clock.advance(1)
        elapsed = clock.now() - t0
        lost = {lost.lease for lost in peer.lost()}
        # every kept lease whose ttl passed is lost, none whose ttl has not (0.5 s of slack for the renewals)
        assert {grants[i].lease for i in kept if ttls[i] <= elapsed - 0.5} <= lost, second
        assert lost <= {grants[i].lease for i in kept if ttls[i] <= elapsed}, second
    assert len(peer.lost()) == len(kept)
    assert empty(engine), engine.statistics()


async def test_status_shows_holders_and_waiters(engine: LocksEngine, clock: Clock) -> None:
    a, b, me = FakePeer(), FakePeer(), FakePeer(local=True)
    grant = await must_take(engine, a, ttl=10)
    await must_take(engine, me, "8")
    task = asyncio.create_task(take(engine, b, wait=60))
    await settle()
    status = engine.status()
    assert status["epoch"] == EPOCH and status["leases"] == 2 and status["waiters"] == 1
    assert [(k["lock"], k["key"], k["limit"], k["waiters"]) for k in status["keys"]] == [
        ("summaries", "7", 1, 1),
        ("summaries", "8", 1, 0),
    ]
    [held] = status["keys"][0]["leases"]
    assert held == {
        "lease": grant.lease,
        "fence": str(grant.fence),
        "expires_at": grant.expires_at,
        "max_hold_at": None,
        "peer": a.id,
    }
    assert status["keys"][1]["leases"][0]["expires_at"] is None
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_close_fails_waiters_and_refuses_calls(engine: LocksEngine) -> None:
    a, b = FakePeer(), FakePeer()
    grant = await must_take(engine, a)
    task = asyncio.create_task(take(engine, b, wait=60))
    await settle()
    engine.close()
    with pytest.raises(ClosedError):
        await task
    with pytest.raises(ClosedError):
        await take(engine, a, "8")
    with pytest.raises(ClosedError):
        engine.renew(a, grant.lease)
    assert engine.release(a, grant.lease) is False
    assert empty(engine)
    assert a.pushes == []


# ---------------------------------------------------------------- wire bodies


def test_a_grant_travels_with_its_fence_as_text() -> None:
    fence = EPOCH << 64 | 12345
    grant = Grant(lease=(1 << 63) - 1, fence=fence, expires_at=1_893_456_010.25, max_hold_at=None, ttl=10.0)
    wire = grant.to_wire()
    assert wire.fence == str(fence) and wire.expires_at_ms == 1_893_456_010_250 and wire.ttl_ms == 10_000
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(wire), type=proto.Granted).to_grant()
    assert back == grant
    local = Grant(lease=1, fence=fence, expires_at=math.inf, max_hold_at=None, ttl=1.0)
    assert local.to_wire().expires_at_ms is None
    assert local.to_wire().to_grant().expires_at == math.inf


# ---------------------------------------------------------------- random sequences


KEYS = ("a", "b")
_params: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "try": st.tuples(st.integers(0, 2), st.sampled_from(KEYS), st.booleans()),
    "hold": st.tuples(st.integers(0, 2), st.sampled_from(KEYS), st.sampled_from([0, 0.5, 3, math.inf, math.inf])),
    "release": st.tuples(st.integers(0, 30)),
    "release_then_cancel": st.tuples(st.integers(0, 30)),
    "late_release": st.tuples(st.integers(0, 30)),
    "renew": st.tuples(st.integers(0, 30), st.integers(0, 2)),
    "cancel": st.tuples(st.integers(0, 30)),
    "advance": st.tuples(st.sampled_from([0.1, 0.5, 1.0, 2.0, 3.0, 6.0])),
    "drop": st.tuples(st.integers(0, 1)),
}
# how often each kind comes: holds most, so that lines form; drops least
_kinds = ["hold"] * 6 + ["try"] * 2 + ["release"] * 2 + ["renew"] * 2 + ["advance"] * 2
_kinds += ["release_then_cancel", "late_release", "cancel", "drop"]
op = st.sampled_from(_kinds).flatmap(lambda kind: _params[kind].map(lambda args: (kind, *args)))


class Model:
    """What the test believes: the leases it holds (and who renewed each last), its waiters per key in the
    order they lined up, the leases that are gone, and the largest fence seen."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[str, FakePeer]] = {}
        self.deadline: dict[int, float] = {}  # lease -> when it runs out unless renewed (epoch s)
        self.gone: list[int] = []
        self.line: dict[str, list[asyncio.Task[Grant | None]]] = {k: [] for k in KEYS}
        self.max_fence = 0


async def scenario(ops: list[tuple[Any, ...]], limit: int, max_hold: float | None) -> None:
    clock = Clock(START)
    engine = LocksEngine(clock, Limits(), EPOCH)
    peers = [FakePeer(), FakePeer(), FakePeer(local=True)]
    everyone = list(peers)
    model = Model()
    tasks: dict[asyncio.Task[Grant | None], FakePeer] = {}

    def lost_leases() -> set[int]:
        return {lost.lease for p in everyone for lost in p.lost()}

    def pick(items: list[Any], i: int) -> Any:
        return items[i % len(items)] if items else None

    async def acquire(p: FakePeer, key: str, wait: float | None, mh: float | None) -> Grant | None:
        return await engine.acquire(p, "renders", key, limit=limit, ttl=5, max_hold=mh, wait=wait)

    def gone_without_release(lease: int) -> bool:
        return lease in lost_leases() or model.held[lease][1].closed

    longest = 0
    for step in ops:
        granted_now: list[Grant] = []
        name = step[0]
        if name == "try":
            _, pi, key, with_max_hold = step
            grant = await acquire(peers[pi], key, None, max_hold if with_max_hold else None)
            if grant is not None:
                model.held[grant.lease] = (key, peers[pi])
                model.deadline[grant.lease] = grant.expires_at
                granted_now.append(grant)
            else:
                assert len(holders(engine, "renders", key)) == limit, "a try was refused a free place"
        elif name == "hold":
            _, pi, key, wait = step
            task = asyncio.create_task(acquire(peers[pi], key, wait, max_hold))
            tasks[task] = peers[pi]
            model.line[key].append(task)
        elif name in ("release", "release_then_cancel"):
            lease = pick(sorted(model.held), step[1])
            if lease is not None:
                key, _ = model.held[lease]
                if not engine.release(peers[step[1] % 3], lease):
                    assert gone_without_release(lease)
                del model.held[lease]
                model.gone.append(lease)
                if name == "release_then_cancel":
                    pending = [t for t in model.line[key] if not t.done()]
                    if pending:
                        pending[0].cancel()  # granted in this very turn, most likely
        elif name == "late_release":
            lease = pick(model.gone, step[1])
            if lease is not None:
                before = engine.status()
                assert engine.release(peers[0], lease) is False
                assert engine.status() == before
        elif name == "renew":
            lease = pick(sorted(model.held), step[1])
            if lease is not None:
                key, _ = model.held[lease]
                try:
                    model.deadline[lease] = engine.renew(peers[step[2]], lease)
                    model.held[lease] = (key, peers[step[2]])
                except LostError:
                    assert gone_without_release(lease)
                    del model.held[lease]
                    model.gone.append(lease)
        elif name == "cancel":
            task = pick([t for t in tasks if not t.done()], step[1])
            if task is not None:
                task.cancel()
        elif name == "advance":
            clock.advance(step[1])
        elif name == "drop":
            old = peers[step[1]]
            old.closed = True
            engine.drop_peer(old)
            peers[step[1]] = FakePeer()  # the SDK reconnects
            everyone.append(peers[step[1]])
        await settle()

        # the waiters that finished in this step
        for key in KEYS:
            line = model.line[key]
            for i, task in enumerate(line):
                if not task.done() or task.cancelled():
                    continue
                error = task.exception()
                if error is not None:
                    assert isinstance(error, InUseError | ClosedError), error
                    continue
                grant = task.result()
                assert grant is not None
                model.held[grant.lease] = (key, tasks[task])
                model.deadline[grant.lease] = grant.expires_at
                granted_now.append(grant)
                # LOCK-03: first come first served: nobody before it in this key's line is still waiting
                assert all(t.done() for t in line[:i]), f"a waiter was skipped on key {key}"
                event(f"a waiter got the key from a line of {min(len(line), 3)}+")
            model.line[key] = [t for t in line if not t.done()]
            longest = max(longest, len(model.line[key]))

        # LOCK-05: a lease that ended without a release was pushed as lost (unless its holder was closed)
        status = engine.status()
        live = {x["lease"]: x for k in status["keys"] for x in k["leases"]}
        now = clock.now()
        for lease in [x for x in model.held if x not in live]:
            assert gone_without_release(lease), "a lease vanished without a lost push"
            assert now >= model.deadline[lease], "a lease ended before its deadline"
            del model.held[lease]
            model.gone.append(lease)
        assert set(live) == set(model.held), "the engine holds a lease nobody was given"
        for lease in live:
            assert now < model.deadline[lease] + 0.05, "a lease outlived its deadline"
            assert live[lease]["expires_at"] == (None if model.deadline[lease] == math.inf else model.deadline[lease])

        # LOCK-01: at most `limit` live leases per key, and nobody waits while a place is free
        for entry in status["keys"]:
            assert entry["limit"] == limit
            assert len(entry["leases"]) <= limit
        for key in KEYS:
            if model.line[key]:
                assert len(holders(engine, "renders", key)) == limit, "a waiter waits while a place is free"

        # LOCK-02: each fence given in this step is above every fence seen before, and they are distinct
        fences = [g.fence for g in granted_now]
        assert all(f > model.max_fence for f in fences)
        assert len(set(fences)) == len(fences)
        assert all(int(x["fence"]) <= max([model.max_fence, *fences]) for x in live.values())
        model.max_fence = max([model.max_fence, *fences])

    event(f"longest line {min(longest, 3)}")
    engine.close()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        assert result is None or isinstance(result, Grant | InUseError | ClosedError | asyncio.CancelledError)
    assert engine.statistics()["leases"] == 0
    clock.close()


# contract: LOCK-01, LOCK-02, LOCK-03, LOCK-04, LOCK-05
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(op, min_size=20, max_size=80),
    limit=st.sampled_from([1, 1, 2, 3]),
    max_hold=st.sampled_from([None, 8.0]),
)
def test_random_sequences_keep_the_invariants(ops: list[tuple[Any, ...]], limit: int, max_hold: float | None) -> None:
    asyncio.run(scenario(ops, limit, max_hold))


# contract: LOCK-04
async def test_one_advance_of_a_test_clock_ends_waits_and_leases_in_the_order_of_their_times(
    engine: LocksEngine, clock: Clock
) -> None:
    """An advance passing a waiter's wait (t=125) and then the holder's lease end (t=175): the wait ends first, so
    the waiter gets InUseError. It got the key when another key's lease (t=50) also ended in the advance: that
    timer ended every lease due by the clock's new time, the holder's among them, before the wait's timer ran."""
    holder, other, waiter = FakePeer(), FakePeer(), FakePeer()
    await must_take(engine, holder, "k", lock="y", ttl=175)
    await must_take(engine, other, "k", lock="x", ttl=50)
    waiting_task = asyncio.ensure_future(take(engine, waiter, "k", lock="y", ttl=10, wait=125))
    await settle()
    clock.advance(200)
    with pytest.raises(InUseError):
        await asyncio.wait_for(waiting_task, 5)
    await settle()
    assert holders(engine, "y", "k") == [] and holders(engine, "x", "k") == []


async def test_status_lists_the_first_keys_and_counts_them_all(engine: LocksEngine) -> None:
    # from trial AO: a status of 100,000 held keys listed them all (17.8 MB, 2 s of the event loop)
    a = FakePeer()
    for i in range(1500):
        await must_take(engine, a, f"k{i:05d}", lock="renders")
    await must_take(engine, a, "k", lock="alpha")
    st = engine.status(max_keys=1000)
    assert st["keys_total"] == 1501 and st["leases"] == 1501 and len(st["keys"]) == 1000
    listed = [(k["lock"], k["key"]) for k in st["keys"]]
    assert listed[0] == ("alpha", "k") and listed[1:] == [("renders", f"k{i:05d}") for i in range(999)]
    small = engine.status(max_keys=5000)
    assert small["keys_total"] == 1501 and len(small["keys"]) == 1501


async def test_a_stopping_store_gives_its_own_asks_and_leaves_the_others_to_the_next_server(
    engine: LocksEngine, clock: Clock
) -> None:
    """Trials DT, DV, DW: once the store begins to stop, another client gets no lease (it would be told at once
    that the store stops), and is never told "held" of a key that is free: its asks, those in line before too,
    wait with no wait of their own until the close fails them (its SDK asks the next server). The store's own
    (local) asks are served as before, ahead of the others in line."""
    own, other = FakePeer(local=True), FakePeer()
    held = await engine.acquire(own, "l", "k", ttl=10, max_hold=None, wait=None)
    assert held is not None
    queued = engine.acquire_start(other, "l", "k", ttl=10, max_hold=None, wait=3)
    assert isinstance(queued, asyncio.Future)
    engine.stop_granting()
    tried = engine.acquire_start(other, "l", "free", ttl=10, max_hold=None, wait=None)
    assert isinstance(tried, asyncio.Future)  # (not None: "held")
    mine = engine.acquire_start(own, "l", "k", ttl=10, max_hold=None, wait=3)
    assert isinstance(mine, asyncio.Future)
    assert engine.release(own, held.lease)
    await settle()
    assert mine.done() and mine.result().fence > held.fence  # the store's own, ahead of the other's
    assert engine.release(own, mine.result().lease)
    clock.advance(5)  # past the other's wait: it is not told "held" of a key let go
    await settle()
    assert not queued.done() and not tried.done()
    free = await engine.acquire(own, "l", "free2", ttl=10, max_hold=None, wait=None)
    assert free is not None  # (the store's own try is answered at once)
    engine.close()
    await settle()
    for fut in (queued, tried):
        assert isinstance(fut.exception(), ClosedError)
