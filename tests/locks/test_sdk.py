"""The SDK's side of locks: bad input, keys, holding a key inside its own hold, whose cancel is whose, a
lease lost after its block ended, the store closing under a lease, and cancels that keep nothing."""

from __future__ import annotations

import asyncio
import contextvars
import random
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InvalidError, LostError
from tinystore.protocol.locks import Release

from ..helpers import ServerProcess, open_store
from .support import holders, other_client

START = datetime(2030, 1, 1, 12, 0, 0)


def fresh(coro: Any) -> asyncio.Task[Any]:
    """A task that does not inherit this one's held keys."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


async def status_is(store: tinystore.Store, lock: str, key: str, want: tuple[int, int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (got := holders(await store.status(), lock, key)) != want:
        assert time.monotonic() < deadline, f"{lock}/{key}: {got}, not {want}"
        await asyncio.sleep(0.01)


@pytest.fixture(params=["embedded", "sidecar"])
async def any_mode(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


# ---------------------------------------------------------------- bad input


BAD: list[tuple[Any, str]] = [
    (lambda s: s.lock("summaries", ttl="500ms"), "lock summaries: ttl 500ms is outside 1s .. 1h"),
    (lambda s: s.lock("summaries", ttl="2h"), "lock summaries: ttl 2h is outside 1s .. 1h"),
    (lambda s: s.lock("summaries", ttl="soon"), "lock summaries: ttl"),
    (lambda s: s.lock("summaries", max_hold=0), "lock summaries: max_hold must be above 0"),
    (lambda s: s.lock("Summaries!"), "lock name 'Summaries!'"),
    (lambda s: s.semaphore("renders", limit=0), "semaphore renders: limit 0 must be an int from 1 to 1000000"),
    (lambda s: s.semaphore("renders", limit=True), "semaphore renders: limit True"),
    (lambda s: s.lock("summaries").hold(7.5), "lock summaries: key 7.5: a key is a str or an int, not float"),
    (lambda s: s.lock("summaries").try_hold(None), "lock summaries: key None: a key is a str or an int"),
    (lambda s: s.lock("summaries").hold(True), "lock summaries: key True: a key is a str or an int, not bool"),
    (lambda s: s.lock("summaries").hold(""), 'lock summaries: key "": a key is 1 to 256 characters'),
    (lambda s: s.lock("summaries").hold("x" * 257), "a key is 1 to 256 characters"),
    (lambda s: s.lock("summaries").hold(7, wait=-1), 'lock summaries: key "7": wait: a duration must be'),
    (lambda s: s.lock("summaries").hold("7", wait="forever"), 'lock summaries: key "7": wait: cannot read'),
    (lambda s: s.semaphore("renders", 2).hold(7, wait=-1), 'semaphore renders: key "7": wait'),
]


async def test_bad_input_is_refused_naming_the_lock_and_key(any_mode: tinystore.Store) -> None:
    for make, message in BAD:
        with pytest.raises(InvalidError) as err:
            make(any_mode)
        assert message in err.value.message
    assert (await any_mode.status())["locks"]["keys"] == []  # nothing was sent


async def test_a_semaphore_and_a_lock_of_one_name_must_agree_on_the_limit(any_mode: tinystore.Store) -> None:
    async with any_mode.semaphore("renders", limit=2).hold("k"):
        with pytest.raises(InvalidError, match="limit 1 differs from limit 2"):
            await fresh(_try(any_mode.lock("renders"), "k"))


# contract: LOCK-03
async def test_the_limit_is_a_keys_own_another_key_or_an_idle_one_may_have_another(any_mode: tinystore.Store) -> None:
    # from trial AM: the limit was kept for the whole name, so while key "a" was held under 2, the idle key "b" was
    # refused under 3, with a message saying "b" had leases (docs/locks.md: the store keeps no limit for an idle key)
    async with any_mode.semaphore("renders", limit=2).hold("a"):
        assert await fresh(_try(any_mode.semaphore("renders", limit=3), "b")) is True
        assert await fresh(_try(any_mode.lock("renders"), "c")) is True
        with pytest.raises(InvalidError, match='key "a": limit 3 differs from limit 2'):
            await fresh(_try(any_mode.semaphore("renders", limit=3), "a"))
    assert await fresh(_try(any_mode.semaphore("renders", limit=3), "a")) is True  # idle now: a new limit holds
    keys = (await any_mode.status())["locks"]["keys"]
    assert keys == []


async def test_keys_are_str_or_int_and_7_is_the_same_key_as_seven_text(any_mode: tinystore.Store) -> None:
    lock = any_mode.lock("summaries")
    async with lock.hold(7) as lease:
        assert lease.key == "7"
        assert (await fresh(_try(lock, "7"))) is False
        assert (await fresh(_try(lock, 8))) is True
        assert (await fresh(_try(lock, "ünïcode ☃"))) is True


async def _try(lock: tinystore.Lock, key: Any) -> bool:
    async with lock.try_hold(key) as lease:
        return lease is not None


async def test_a_lease_has_a_128_bit_fence_an_aware_expiry_and_a_lost_event(tmp_path: Path) -> None:
    async with open_store("sidecar", tmp_path / "store") as store:
        async with store.lock("summaries", ttl="30s").hold("k") as lease:
            assert isinstance(lease, tinystore.Lease) and not isinstance(lease, tinystore.Permit)
            assert isinstance(lease.fence, int) and lease.fence >> 64 > 1_600_000_000_000
            assert lease.fence < 1 << 128
            assert lease.expires_at.tzinfo is not None
            assert timedelta(seconds=28) < lease.expires_at - datetime.now(UTC) < timedelta(seconds=31)
            assert lease.max_hold_at is None
            assert isinstance(lease.lost, asyncio.Event) and not lease.lost.is_set()
            assert 'lock summaries: key "k"' in repr(lease)


# ---------------------------------------------------------------- a key inside its own hold


async def test_a_task_may_take_another_permit_of_a_semaphore_while_one_is_free(any_mode: tinystore.Store) -> None:
    """A semaphore task holding some of its key's permits asks for one more like anyone (trial Z: it was refused as
    "would wait for itself", though a permit was free); holding all of them, asking again is refused."""
    slots = any_mode.semaphore("renders", limit=2)
    async with slots.hold("gpu") as first:
        assert isinstance(first, tinystore.Permit)
        async with slots.try_hold("gpu") as second:
            assert second is not None and second.fence != first.fence
            with pytest.raises(
                InvalidError, match=r'key "gpu": all 2 permits already held by this task.*wait for itself'
            ):
                async with slots.hold("gpu"):
                    pass
            with pytest.raises(
                InvalidError, match=r"all 2 permits .* try_hold inside its own hold would always give None"
            ):
                async with slots.try_hold("gpu"):
                    pass
            # trial AH: a smaller limit than the leases held was told "all 2 permits already held"
            with pytest.raises(InvalidError, match=r"limit 1 differs from the limit of the 2 leases this task holds"):
                async with any_mode.semaphore("renders", limit=1).try_hold("gpu"):
                    pass
        async with slots.hold("gpu", wait="1s") as again:
            assert again is not None


async def test_holding_a_key_inside_its_own_hold_is_invalid(any_mode: tinystore.Store) -> None:
    lock = any_mode.lock("summaries")
    async with lock.hold(7):
        with pytest.raises(InvalidError, match=r'lock summaries: key "7": already held by this task.*wait for itself'):
            async with lock.hold("7"):
                pass
        with pytest.raises(InvalidError, match="try_hold inside its own hold would always give None"):
            async with lock.try_hold(7):
                pass

        async def child() -> None:
            async with lock.hold(7, wait="5s"):
                pass

        with pytest.raises(InvalidError):  # a task started inside the block
            await asyncio.create_task(child())
        async with lock.hold(8) as other:  # another key is fine
            assert other is not None
        async with any_mode.lock("other").hold(7) as other:  # and another lock
            assert other is not None
    # a task started inside a block that ended may hold the key
    async with lock.hold(7):
        straggler = asyncio.create_task(_later(lock))
    assert await straggler


async def _later(lock: tinystore.Lock) -> bool:
    await asyncio.sleep(0.05)
    async with lock.hold(7, wait="5s") as lease:
        return lease is not None


# ---------------------------------------------------------------- whose cancel is whose


async def test_a_cancel_from_elsewhere_stays_a_cancel(any_mode: tinystore.Store) -> None:
    lock = any_mode.lock("summaries")
    inside = asyncio.Event()

    async def holder() -> None:
        async with lock.hold("k"):
            inside.set()
            await asyncio.sleep(30)

    task = fresh(holder())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await status_is(any_mode, "summaries", "k", (0, 0))


async def test_a_lost_lease_cancels_the_block_and_leaves_no_cancel_behind(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "store", clock=START) as store:
        lock = store.lock("summaries", ttl="10s")
        inside = asyncio.Event()
        after: list[str] = []

        async def holder() -> None:
            with pytest.raises(LostError):
                async with lock.hold("k"):
                    inside.set()
                    await asyncio.sleep(30)
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0
            await asyncio.sleep(0.01)  # no cancel is left over for the code after the block
            after.append("went on")

        task = fresh(holder())
        await inside.wait()
        await store.clock.advance("1m")
        await task
        assert after == ["went on"]


async def test_a_cancel_from_elsewhere_together_with_a_loss_stays_a_cancel(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "store", clock=START) as store:
        lock = store.lock("summaries", ttl="10s")
        inside = asyncio.Event()

        async def holder() -> None:
            async with lock.hold("k") as lease:
                inside.set()
                await lease.lost.wait()  # the loss cancels... and so does someone else
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(30)

        task = fresh(holder())
        await inside.wait()
        store.clock.advance("1m")  # sent; the push comes before its answer
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_block_that_swallows_the_cancel_still_gets_lost_error(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "store", clock=START) as store:
        lock = store.lock("summaries", ttl="10s")

        async def holder() -> str:
            async with lock.hold("k") as lease:
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    pass  # careless code
                assert lease.lost.is_set()
            return "returned"

        task = fresh(holder())
        await asyncio.sleep(0.1)
        await store.clock.advance("1m")
        with pytest.raises(LostError):
            await task


async def test_an_error_of_the_block_wins_over_a_loss_and_carries_a_note(tmp_path: Path) -> None:
    async with open_store("sidecar", tmp_path / "store") as store, other_client(store) as other:
        lock = store.lock("summaries", ttl="30s")
        with pytest.raises(KeyError) as err:
            async with lock.hold("k") as lease:
                await other._call("locks.release", Release(lease=lease.id), Any)
                raise KeyError("boom")
        assert any("the lease was lost" in note for note in err.value.__notes__)


async def test_an_error_the_block_raises_as_the_loss_cancels_it_is_kept_with_a_note(tmp_path: Path) -> None:
    # trial FY: a block's finally that raised as the loss cancelled the block gave LostError, the block's own error
    # only its cause (docs/locks.md: a block that raised its own error keeps it; the loss is added as a note)
    async with open_store("private", tmp_path / "store", clock=START) as store:
        lock = store.lock("summaries", ttl="10s")

        async def holder() -> None:
            async with lock.hold("k"):
                try:
                    await asyncio.sleep(30)
                finally:
                    raise ValueError("own error")

        task = fresh(holder())
        await asyncio.sleep(0.1)
        await store.clock.advance("1m")
        with pytest.raises(ValueError, match="own error") as err:
            await task
        assert any(note.startswith("and the lease was lost: lock summaries") for note in err.value.__notes__)


async def test_lost_error_when_the_release_finds_the_lease_gone(any_mode: tinystore.Store) -> None:
    """The block ended before it heard of the loss: the release finds the lease gone."""
    async with other_client(any_mode) as other:
        lock = other.lock("summaries", ttl="30s")
        with pytest.raises(LostError, match='lock summaries: key "k": the lease was gone when the block ended'):
            async with lock.hold("k") as lease:
                await any_mode._call("locks.release", Release(lease=lease.id), Any)  # behind its back
        assert lease.lost.is_set()


# ---------------------------------------------------------------- closing and cancelling keep nothing


async def test_closing_the_store_lets_its_leases_go_at_once(tmp_path: Path) -> None:
    async with open_store("sidecar", tmp_path / "store") as store:
        mine = await tinystore.open(tmp_path / "store")
        lock = mine.lock("summaries", ttl="1h")
        inside = asyncio.Event()

        async def holder() -> None:
            async with lock.hold("k"):
                inside.set()
                await asyncio.sleep(30)

        task = fresh(holder())
        await inside.wait()
        await mine.close()
        with pytest.raises(LostError, match="the store was closed"):
            await task
        async with store.lock("summaries").hold("k", wait=0) as lease:  # not after an hour's ttl
            assert lease is not None


async def test_cancelled_holds_keep_nothing(tmp_path: Path) -> None:
    """Many holds of free and held keys cancelled at random moments (batched or alone): afterwards the store
    holds nothing and every key is free."""
    async with open_store("sidecar", tmp_path / "store") as store:
        lock = store.lock("summaries", ttl="30s")
        rng = random.Random(4)

        async def one(key: str) -> None:
            async with lock.hold(key, wait="10s"):
                await asyncio.sleep(rng.uniform(0, 0.003))

        for _ in range(15):
            tasks = [fresh(one(f"k{rng.randrange(4)}")) for _ in range(40)]
            await asyncio.sleep(rng.uniform(0, 0.004))
            for task in tasks:
                if rng.random() < 0.5:
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        deadline = time.monotonic() + 10
        while (await store.status())["locks"]["keys"]:
            assert time.monotonic() < deadline, (await store.status())["locks"]
            await asyncio.sleep(0.01)


async def test_a_hold_waits_in_line_across_many_callers_and_hands_over_in_order(any_mode: tinystore.Store) -> None:
    lock = any_mode.lock("summaries", ttl="30s")
    order: list[int] = []

    async def contender(i: int) -> None:
        async with lock.hold("hot", wait="20s"):
            order.append(i)
            await asyncio.sleep(0)

    await asyncio.gather(*(fresh(contender(i)) for i in range(50)))
    assert sorted(order) == list(range(50))
    await status_is(any_mode, "summaries", "hot", (0, 0))


async def test_a_blocked_loop_past_the_ttl_declares_the_lease_lost(tmp_path: Path) -> None:
    """No renewal could succeed while this process's loop was blocked for longer than the ttl: the SDK declares
    the lease lost itself (the store gave the key to another meanwhile, or soon will)."""
    async with open_store("sidecar", tmp_path / "store") as store, other_client(store) as other:
        t0 = time.monotonic()
        with pytest.raises(LostError, match=r"no renewal succeeded for|the lease ran out at"):
            async with store.lock("summaries", ttl="1s").hold("k") as lease:
                time.sleep(1.2)  # noqa: ASYNC251 -- a loop blocked as a long GC pause would
                await asyncio.sleep(5)
        assert lease.lost.is_set() and time.monotonic() - t0 < 3
        async with other.lock("summaries").try_hold("k") as theirs:
            assert theirs is not None


async def test_a_store_that_does_not_answer_renewals_makes_the_sdk_declare_the_lease_lost(tmp_path: Path) -> None:
    """The store froze (or the network did): no renewal succeeds, so before the ttl is up the SDK declares the
    lease lost itself rather than let the block run on past it."""
    server = ServerProcess(tmp_path / "store").start()
    try:
        store = await tinystore.open(tmp_path / "store")
        try:
            t0 = time.monotonic()
            with pytest.raises(LostError, match="no renewal succeeded for"):
                async with store.lock("summaries", ttl="1s").hold("k"):
                    server.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
                    await asyncio.sleep(5)
            assert 0.85 <= time.monotonic() - t0 < 1.5  # at ttl minus its margin, not later
        finally:
            server.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            await store.close()
    finally:
        server.stop()
