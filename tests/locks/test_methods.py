"""The lock methods as any client may call them: ``locks.acquire`` waits in line and a CANCEL takes it out
cleanly (also one that comes before the server began to wait); ``locks.acquire_many`` answers each item on
its own; ``locks.abandon`` takes queued items out of their lines."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError
from tinystore.protocol.locks import Abandon, Acquire, AcquireMany, AcquireOutcome, Granted, Release, Released

from ..helpers import open_store
from .support import holders


@pytest.fixture
async def remote(tmp_path: Path) -> Any:
    async with open_store("private", tmp_path / "store") as store:
        yield store


def acquire(key: str = "k", wait_ms: int | None = None, lock: str = "summaries") -> Acquire:
    return Acquire(lock=lock, key=key, ttl_ms=30_000, wait_ms=wait_ms)


async def waiting(store: tinystore.Store, n: int, key: str = "k") -> None:
    deadline = time.monotonic() + 10
    while holders(await store.status(), "summaries", key)[1] != n:
        assert time.monotonic() < deadline, (await store.status())["locks"]
        await asyncio.sleep(0.01)


async def test_a_cancelled_acquire_leaves_the_line_and_keeps_nothing(remote: tinystore.Store) -> None:
    held: Granted = await remote._call("locks.acquire", acquire(), Granted)
    calls = [asyncio.ensure_future(remote._call("locks.acquire", acquire(wait_ms=20_000), Granted)) for _ in range(3)]
    await waiting(remote, 3)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await waiting(remote, 0)
    # cancels that come right behind their request, before the server began to wait: nothing is kept
    for _ in range(20):
        call = asyncio.ensure_future(remote._call("locks.acquire", acquire(wait_ms=20_000), Granted))
        await asyncio.sleep(0)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
    await waiting(remote, 0)
    released: Released = await remote._call("locks.release", Release(lease=held.lease), Released)
    assert released.released
    await asyncio.sleep(0.05)
    assert holders(await remote.status(), "summaries", "k") == (0, 0)  # no cancelled caller got the key


async def test_acquire_many_answers_each_item_on_its_own(remote: tinystore.Store) -> None:
    items = [acquire("a"), acquire("a"), acquire("b", lock="Bad Name"), acquire("a", wait_ms=0), acquire("a", 5000)]
    got: list[AcquireOutcome] = await remote._call(
        "locks.acquire_many", AcquireMany(items=items, tickets=[1, 2, 3, 4, 5]), list[AcquireOutcome]
    )
    assert [o.ticket for o in got] == [1, 2, 3, 4, 5]
    assert got[0].lease and int(got[0].fence) > 0
    assert got[1].held and not got[1].lease  # a try that found it held
    assert got[2].code == "invalid" and "lock name 'Bad Name'" in got[2].message
    assert got[3].code == "in_use"
    assert got[4].queued
    await waiting(remote, 1, "a")
    await remote._call("locks.abandon", Abandon(tickets=[5]), Any)
    await waiting(remote, 0, "a")
    with pytest.raises(InvalidError, match="1 items but 2 tickets"):
        await remote._call("locks.acquire_many", AcquireMany(items=[acquire()], tickets=[1, 2]), Any)


async def test_a_max_hold_or_wait_past_100_years_is_refused_and_grants_nothing(remote: tinystore.Store) -> None:
    """Trial DG: a raw client's max_hold_ms of 2**64-1 was granted, then the answer (its max_hold_at) could not be
    encoded: the caller was told of an internal error while the key stayed held, by nobody, for the ttl."""
    huge = Acquire(lock="summaries", key="k", ttl_ms=30_000, max_hold_ms=2**64 - 1)
    with pytest.raises(InvalidError, match=r"max_hold .* at most 100 years \(36500d\)"):
        await remote._call("locks.acquire", huge, Granted)
    got: list[AcquireOutcome] = await remote._call(
        "locks.acquire_many", AcquireMany(items=[huge], tickets=[1]), list[AcquireOutcome]
    )
    assert got[0].code == "invalid" and "at most 100 years" in got[0].message
    far = Acquire(lock="summaries", key="k", ttl_ms=30_000, wait_ms=2**64 - 1)
    with pytest.raises(InvalidError, match=r"wait .* from 0 to 100 years \(36500d\)"):
        await remote._call("locks.acquire", far, Granted)
    assert holders(await remote.status(), "summaries", "k") == (0, 0)
    held: Granted = await remote._call("locks.acquire", acquire(wait_ms=0), Granted)  # the key is free
    assert held.lease


async def test_many_items_in_one_call_are_refused_as_read_and_the_sdk_sends_them_in_parts(
    remote: tinystore.Store,
) -> None:
    """Trial DI: 250,000 acquires or 15 million releases in one frame kept the server's loop, and every other
    client, waiting seconds. Past ACQUIRE_MANY_MAX (RELEASE_MANY_MAX) they are refused as the body is read; the
    SDK's batches of one loop turn stay within them."""
    from tinystore.protocol.locks import ACQUIRE_MANY_MAX, RELEASE_MANY_MAX, ReleaseMany

    n = ACQUIRE_MANY_MAX + 1
    many = AcquireMany(items=[acquire(str(i)) for i in range(n)], tickets=list(range(1, n + 1)))
    with pytest.raises(InvalidError, match=r"locks.acquire_many: Expected `array` of length <= 1000"):
        await remote._call("locks.acquire_many", many, Any)
    assert holders(await remote.status(), "summaries", "0") == (0, 0)
    with pytest.raises(InvalidError, match=r"locks.release_many: Expected `array` of length <= 10000"):
        await remote._call("locks.release_many", ReleaseMany(leases=[1] * (RELEASE_MANY_MAX + 1)), Any)
    with pytest.raises(InvalidError, match=r"locks.abandon: Expected `array` of length <= 10000"):
        await remote._call("locks.abandon", Abandon(tickets=[1] * (RELEASE_MANY_MAX + 1)), Any)

    # through the SDK: 2,500 holds asked in one loop turn, then let go in one
    lock = remote.lock("many", ttl="30s")
    entered = [lock.try_hold(i) for i in range(2500)]
    leases = await asyncio.gather(*(hold.__aenter__() for hold in entered))
    assert all(lease is not None for lease in leases)
    await asyncio.gather(*(hold.__aexit__(None, None, None) for hold in entered))
    assert not [row for row in (await remote.status())["locks"]["keys"] if row["lock"] == "many"]
