"""Lock contracts (LOCK-01..07): over the embedded, private and sidecar ways of reaching the store (the
``store`` fixture); LOCK-07, about connections, over private, sidecar and TCP (``remote_store``).

Time-dependent rules use short ttls or a test clock (``open(..., clock=datetime)``), so nothing sleeps long.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InUseError, LostError
from tinystore.protocol.locks import Release, Renew
from tinystore.server import paths

from ..helpers import ServerProcess, drop_connection, free_port, open_store, stop_sidecar, write_tokens
from ..locks.support import holders, other_client

START = datetime(2030, 1, 1, 12, 0, 0)


def in_new_context(coro: Any) -> asyncio.Task[Any]:
    """A task that does not inherit this one's held keys (as a task of another part of the program)."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


# ---------------------------------------------------------------- LOCK-01


# contract: LOCK-01
async def test_one_holder_of_a_key_at_a_time(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="30s")
    inside = 0
    most = 0
    fences: list[int] = []

    async def worker(i: int) -> None:
        nonlocal inside, most
        for _ in range(5):
            async with lock.hold(7, wait="20s") as lease:
                inside += 1
                most = max(most, inside)
                fences.append(lease.fence)
                await asyncio.sleep(0.001 * (i % 3))
                inside -= 1

    async with other_client(store) as other:
        other_lock = other.lock("summaries", ttl="30s")

        async def other_worker() -> None:
            nonlocal inside, most
            for _ in range(5):
                async with other_lock.hold("7", wait="20s") as lease:
                    inside += 1
                    most = max(most, inside)
                    fences.append(lease.fence)
                    await asyncio.sleep(0.001)
                    inside -= 1

        await asyncio.gather(*(in_new_context(worker(i)) for i in range(8)), in_new_context(other_worker()))
    assert most == 1
    assert len(fences) == 45 and len(set(fences)) == 45


# contract: LOCK-01
async def test_a_held_key_is_not_given_to_another_client(store: tinystore.Store) -> None:
    lock = store.lock("summaries")
    async with lock.try_hold("chat-1") as lease, other_client(store) as other:
        assert lease is not None
        async with other.lock("summaries").try_hold("chat-1") as theirs:
            assert theirs is None
        async with other.lock("summaries").try_hold("chat-2") as theirs:
            assert theirs is not None  # another key is another lease
        assert holders(await store.status(), "summaries", "chat-1") == (1, 0)


# contract: LOCK-01
async def test_a_semaphore_gives_at_most_limit_permits(store: tinystore.Store) -> None:
    slots = store.semaphore("renders", limit=3, ttl="30s")
    inside = 0
    most = 0

    async def render(i: int) -> None:
        nonlocal inside, most
        async with slots.hold("gpu", wait="20s") as permit:
            assert isinstance(permit, tinystore.Permit)
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(in_new_context(render(i)) for i in range(10)))
    assert most == 3
    release = asyncio.Event()
    got: list[tinystore.Permit | None] = []

    async def take() -> None:
        async with slots.try_hold("gpu") as permit:
            got.append(permit)
            await release.wait()

    tasks = [in_new_context(take()) for _ in range(4)]
    while len(got) < 4:
        await asyncio.sleep(0.005)
    permits = [p for p in got if p is not None]
    assert len(permits) == 3 and len({p.fence for p in permits}) == 3  # the fourth got None at once
    release.set()
    await asyncio.gather(*tasks)


# ---------------------------------------------------------------- LOCK-02


# contract: LOCK-02
async def test_fences_grow_across_locks_and_keys(store: tinystore.Store) -> None:
    fences: list[int] = []
    for name in ("a", "b"):
        lock = store.lock(name)
        for key in (1, "x", 2):
            async with lock.hold(key) as lease:
                fences.append(lease.fence)
    async with store.semaphore("s", limit=2).hold("k") as permit:
        fences.append(permit.fence)
    assert fences == sorted(fences) and len(set(fences)) == len(fences)
    assert all(0 < f < 1 << 128 for f in fences)
    # the high 64 bits are the store's epoch: ms since the Unix epoch at its start, near now
    epoch_ms = fences[0] >> 64
    assert abs(epoch_ms / 1000 - time.time()) < 3600
    assert len(f"{fences[-1]:040d}") == 40


async def _fences(store: tinystore.Store, n: int = 3) -> list[int]:
    out = []
    for i in range(n):
        async with store.lock("summaries").hold(i) as lease:
            out.append(lease.fence)
    return out


@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
# contract: LOCK-02
async def test_fences_after_a_restart_are_larger_than_every_fence_before(mode: str, tmp_path: Path) -> None:
    directory = tmp_path / "store"
    before: list[int] = []
    for _ in range(2):
        async with open_store(mode, directory) as store:
            got = await _fences(store)
            assert not before or min(got) > max(before)
            before += got


# contract: LOCK-02
async def test_fences_grow_when_the_clock_goes_back(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    async with open_store("embedded", directory, clock=datetime(2040, 1, 1)) as store:
        later = await _fences(store)
    # the wall clock now says 2001: the persisted epoch still only grows
    async with open_store("embedded", directory, clock=datetime(2001, 1, 1)) as store:
        earlier_clock = await _fences(store)
        assert min(earlier_clock) > max(later)
    async with open_store("private", directory, clock=datetime(2001, 1, 1)) as store:
        assert min(await _fences(store)) > max(earlier_clock)


# contract: LOCK-02
async def test_fences_after_a_kill_and_restart_are_larger(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        store = await tinystore.open(directory)
        before = await _fences(store)
        server.kill()
        server = ServerProcess(directory).start()
        after = await _fences(store)  # the SDK reconnected to the new server
        await store.close()
    finally:
        server.stop()
    assert min(after) > max(before)


# ---------------------------------------------------------------- LOCK-03


# contract: LOCK-03
async def test_try_hold_returns_none_at_once_when_held(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="30s")
    held = asyncio.Event()
    done = asyncio.Event()

    async def holder() -> None:
        async with lock.hold("k"):
            held.set()
            await done.wait()

    task = in_new_context(holder())
    await held.wait()
    t0 = time.monotonic()
    async with lock.try_hold("k") as lease:
        assert lease is None
    assert time.monotonic() - t0 < 0.5
    done.set()
    await task
    async with lock.try_hold("k") as lease:
        assert lease is not None


# contract: LOCK-03
async def test_hold_waits_in_line_first_come_first_served(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="30s")
    order: list[int] = []
    release = asyncio.Event()

    async def first() -> None:
        async with lock.hold("k"):
            await release.wait()

    async def waiter(i: int) -> None:
        async with lock.hold("k", wait="20s"):
            order.append(i)
            await asyncio.sleep(0.001)

    holder = in_new_context(first())
    await _until_held(store, "summaries", "k")
    waiters = []
    for i in range(6):
        waiters.append(in_new_context(waiter(i)))
        await _until_waiting(store, "summaries", "k", i + 1)  # each is in line before the next asks
    release.set()
    await asyncio.gather(holder, *waiters)
    assert order == list(range(6))


async def _until_held(store: tinystore.Store, lock: str, key: str) -> None:
    deadline = time.monotonic() + 10
    while holders(await store.status(), lock, key)[0] < 1:
        assert time.monotonic() < deadline, "the key was not held"
        await asyncio.sleep(0.005)


async def raw_release(store: tinystore.Store, lease: int) -> bool:
    """A release by id, as any client may send it (a late holder's, or someone else's)."""
    got = await store._call("locks.release", Release(lease=lease), Any)
    return bool(got if isinstance(got, bool) else got["released"])


async def raw_renew(store: tinystore.Store, lease: int) -> None:
    await store._call("locks.renew", Renew(lease=lease), Any)


async def _until_waiting(store: tinystore.Store, lock: str, key: str, n: int) -> None:
    deadline = time.monotonic() + 10
    while holders(await store.status(), lock, key)[1] < n:
        assert time.monotonic() < deadline, "the waiters did not get in line"
        await asyncio.sleep(0.005)


# contract: LOCK-03
async def test_hold_gives_up_after_the_wait_with_in_use_error(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="30s")
    async with lock.hold(7) as lease:
        assert lease is not None

        async def other(wait: Any) -> float:
            t0 = time.monotonic()
            with pytest.raises(InUseError) as err:
                async with lock.hold("7", wait=wait):
                    pass
            said = "held (no wait)" if wait == 0 else "held for all of the"
            assert f'lock summaries: key "7": {said}' in err.value.message
            return time.monotonic() - t0

        took = await in_new_context(other("200ms"))
        assert 0.19 <= took < 1.2
        took = await in_new_context(other(0))
        assert took < 0.3
        took = await in_new_context(other(timedelta(seconds=0.4)))
        assert 0.39 <= took < 1.5


# ---------------------------------------------------------------- LOCK-04


# contract: LOCK-04
async def test_the_key_is_let_go_when_the_block_ends(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="30s")

    class Boom(Exception):
        pass

    for how in ("returns", "raises", "cancelled"):
        inside = asyncio.Event()
        end = asyncio.Event()

        async def holder(how: str = how, inside: asyncio.Event = inside, end: asyncio.Event = end) -> None:
            async with lock.hold("k"):
                inside.set()
                await end.wait()  # a cancel comes here
                if how == "raises":
                    raise Boom

        task = in_new_context(holder())
        await inside.wait()
        got_at: list[float] = []

        async def next_in_line(got_at: list[float] = got_at) -> None:
            async with lock.hold("k", wait="10s") as lease:
                got_at.append(time.monotonic())
                assert lease is not None

        waiter = in_new_context(next_in_line())
        await _until_waiting(store, "summaries", "k", 1)
        ended = time.monotonic()
        if how == "cancelled":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "raises":
            end.set()
            with pytest.raises(Boom):
                await task
        else:
            end.set()
            await task
        await waiter
        assert got_at[0] - ended < 0.5, how  # at once, not after a ttl
        assert holders(await store.status(), "summaries", "k") == (0, 0), how


# contract: LOCK-04
async def test_a_cancelled_waiter_leaves_the_line_and_keeps_nothing(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="30s")
    async with lock.hold("k"):

        async def wait_for_it() -> None:
            async with lock.hold("k", wait="20s"):
                raise AssertionError("a cancelled waiter got the key")

        tasks = [in_new_context(wait_for_it()) for _ in range(5)]
        await _until_waiting(store, "summaries", "k", 5)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await eventually_status(store, lambda s: holders(s, "summaries", "k") == (1, 0))
    await eventually_status(store, lambda s: holders(s, "summaries", "k") == (0, 0))
    async with lock.try_hold("k") as lease:
        assert lease is not None


async def eventually_status(store: tinystore.Store, pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = await store.status()
        if pred(status):
            return
        assert time.monotonic() < deadline, f"status never matched: {status['locks']}"
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------- LOCK-05


# contract: LOCK-05
async def test_the_sdk_renews_a_lease_while_its_block_runs(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="1s")
    async with other_client(store) as other:
        async with other.lock("summaries", ttl="1s").hold("k") as lease:
            first = lease.expires_at
            await asyncio.sleep(1.25)  # past the ttl: renewed every third of it
            assert not lease.lost.is_set()
            assert lease.expires_at > first
            async with lock.try_hold("k") as theirs:
                assert theirs is None
        async with lock.try_hold("k") as theirs:
            assert theirs is not None


# contract: LOCK-05
async def test_a_refused_renewal_cancels_the_block_with_lost_error(store: tinystore.Store) -> None:
    reached: list[str] = []
    async with other_client(store) as other:
        t0 = time.monotonic()
        with pytest.raises(LostError) as err:
            async with other.lock("summaries", ttl="1s").hold("k") as lease:
                # someone lets go of it by id behind the holder's back: its next renewal is refused
                assert await raw_release(store, lease.id)
                try:
                    await asyncio.sleep(30)
                finally:
                    reached.append("cancelled")
        assert time.monotonic() - t0 < 2
        assert reached == ["cancelled"]
        assert lease.lost.is_set()
        assert 'lock summaries: key "k"' in err.value.message or "lease" in err.value.message


# contract: LOCK-05
async def test_a_lease_over_a_connection_runs_out_and_its_late_release_lets_nothing_go(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "store", clock=START) as store:
        lock = store.lock("summaries", ttl="10s")
        async with other_client(store) as other:
            other_lock = other.lock("summaries", ttl="10s")
            in_block = asyncio.Event()
            cancelled: list[bool] = []

            old: list[int] = []

            async def stale() -> None:
                async with lock.hold("k") as lease:
                    old.append(lease.id)
                    in_block.set()
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        cancelled.append(lease.lost.is_set())
                        raise

            task = in_new_context(stale())
            await in_block.wait()
            await store.clock.advance("1h")  # no renewal can have come within the ttl
            with pytest.raises(LostError) as err:
                await task
            assert cancelled == [True]
            assert "ran out" in err.value.message
            async with other_lock.hold("k", wait=0) as theirs:  # the key is free for another
                assert theirs is not None
                # the old holder's late renewal is refused, and its late release lets go nothing another holds
                with pytest.raises(LostError):
                    await raw_renew(store, old[0])
                assert not await raw_release(store, old[0])
                assert holders(await store.status(), "summaries", "k") == (1, 0)
                async with lock.try_hold("k") as third:
                    assert third is None
                assert not theirs.lost.is_set()


# contract: LOCK-05
async def test_in_embedded_mode_a_lease_of_this_process_never_runs_out_by_ttl(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "store", clock=START) as store:
        lock = store.lock("summaries", ttl="1s")
        async with lock.hold("k") as lease:
            assert lease.expires_at.year == 9999  # never
            await store.clock.advance("1h")
            await asyncio.sleep(0.01)
            assert not lease.lost.is_set()
            async with other_client(store) as other:
                async with other.lock("summaries", ttl="1s").try_hold("k") as theirs:
                    assert theirs is None
        # ...but a lease of another process reaching the embedded store through its socket does run out
        async with other_client(store) as other:
            with pytest.raises(LostError):
                async with other.lock("summaries", ttl="1s").hold("k") as theirs:
                    await store.clock.advance("1h")
                    await asyncio.sleep(30)
            async with lock.try_hold("k") as mine:
                assert mine is not None


# ---------------------------------------------------------------- LOCK-06


@pytest.mark.parametrize("mode", ["embedded", "private"])
# contract: LOCK-06
async def test_max_hold_ends_a_lease_whatever_its_renewals(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "store", clock=START) as store:
        lock = store.lock("summaries", ttl="1h", max_hold="1m")
        with pytest.raises(LostError) as err:
            async with lock.hold("k") as lease:
                assert lease.max_hold_at is not None
                assert lease.max_hold_at - datetime.fromtimestamp(await store.clock.now(), UTC) <= timedelta(
                    minutes=1, seconds=1
                )
                await store.clock.advance("59s")
                await asyncio.sleep(0.01)
                assert not lease.lost.is_set()
                await store.clock.advance("2s")
                await asyncio.sleep(30)
        assert "max_hold of 1m" in err.value.message
        async with lock.try_hold("k") as again:
            assert again is not None


# contract: LOCK-06
async def test_max_hold_ends_a_lease_in_real_time(store: tinystore.Store) -> None:
    lock = store.lock("summaries", ttl="30s", max_hold="400ms")
    t0 = time.monotonic()
    with pytest.raises(LostError):
        async with lock.hold("k"):
            await asyncio.sleep(10)
    assert 0.35 <= time.monotonic() - t0 < 2.5
    async with lock.try_hold("k") as again:
        assert again is not None


# ---------------------------------------------------------------- LOCK-07


# contract: LOCK-07
async def test_a_lease_survives_a_dropped_connection_and_is_renewed(remote_store: tinystore.Store) -> None:
    store = remote_store
    lock = store.lock("summaries", ttl="1s")
    async with lock.hold("k") as lease:
        t0 = time.monotonic()
        for _ in range(3):
            drop_connection(store)
            await asyncio.sleep(0.3)
        await asyncio.sleep(1.3 - (time.monotonic() - t0))  # past the ttl: the SDK reconnected and renewed it
        assert not lease.lost.is_set()
        status = await store.status()
        assert holders(status, "summaries", "k") == (1, 0)
        assert status["locks"]["keys"][0]["fences"] == [str(lease.fence)]
    assert holders(await store.status(), "summaries", "k") == (0, 0)


# contract: LOCK-07
async def test_a_waiter_whose_connection_drops_asks_again(remote_store: tinystore.Store) -> None:
    store = remote_store
    lock = store.lock("summaries", ttl="30s")
    release = asyncio.Event()

    async def first() -> None:
        async with lock.hold("k"):
            await release.wait()

    holder = in_new_context(first())
    await asyncio.sleep(0.05)

    async def second() -> int:
        async with lock.hold("k", wait="10s") as lease:
            return lease.fence

    waiter = in_new_context(second())
    await _until_waiting(store, "summaries", "k", 1)
    drop_connection(store)
    await asyncio.sleep(0.3)
    await _until_waiting(store, "summaries", "k", 1)  # back in line after the reconnect
    release.set()
    await holder
    assert await asyncio.wait_for(waiter, 10) > 0


@pytest.mark.parametrize("mode", ["private", "sidecar", "tcp"])
# contract: LOCK-07
async def test_after_a_restart_nobody_holds_anything_and_old_leases_are_lost(mode: str, tmp_path: Path) -> None:
    directory = tmp_path / "store"
    servers: list[ServerProcess] = []
    if mode == "tcp":
        tokens, admin, _ = write_tokens(tmp_path)
        port = free_port()
        args = ["--listen", f"tcp://127.0.0.1:{port}", "--tokens", str(tokens)]
        servers.append(ServerProcess(directory, *args).start())
        store = await tinystore.connect(f"tcp://127.0.0.1:{port}", token=admin)
    else:
        args = []
        store = await (tinystore.open(directory, private=True) if mode == "private" else tinystore.open(directory))

    async def restart() -> None:
        info = paths.read_address(directory) or {}
        os.kill(int(info["pid"]), signal.SIGKILL)
        if mode == "tcp":  # a private server or a sidecar is started again by the SDK itself
            await asyncio.sleep(0.1)
            servers.append(ServerProcess(directory, *args).start())

    try:
        lock = store.lock("summaries", ttl="30s")
        old_epoch = store.epoch
        with pytest.raises(LostError) as err:
            async with lock.hold("k") as lease:
                old_id, old_fence = lease.id, lease.fence
                await restart()
                await asyncio.sleep(30)  # cancelled when the SDK finds the store restarted
        assert "restarted" in err.value.message
        assert store.epoch > old_epoch
        # nobody holds anything, and a renewal of the older lease is refused (lost)
        status = await store.status()
        assert status["locks"]["leases"] == 0 and status["locks"]["keys"] == []
        with pytest.raises(LostError):
            await raw_renew(store, old_id)
        assert not await raw_release(store, old_id)
        async with lock.try_hold("k") as again:
            assert again is not None and again.fence > old_fence
    finally:
        await store.close()
        for server in servers:
            server.stop()
        await stop_sidecar(directory)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.parametrize("mode", ["private", "sidecar"])
# contract: LOCK-07
async def test_a_block_that_ends_while_the_store_restarts_is_told_the_store_restarted(
    mode: str, sig: int, tmp_path: Path
) -> None:
    # from trial BS: the block's release went to the next server, which held nothing (or found the store closed),
    # and the LostError said the lease ran out (or reached max_hold), though its ttl was far from over
    directory = tmp_path / "store"
    store = await (tinystore.open(directory, private=True) if mode == "private" else tinystore.open(directory))
    try:
        with pytest.raises(LostError) as err:
            async with store.lock("nightly", ttl="30s").hold("k"):
                pid = int((paths.read_address(directory) or {})["pid"])
                os.kill(pid, sig)
                for _ in range(300):  # gone; the block ends now, and the SDK starts a server again
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    await asyncio.sleep(0.02)
        if sig == signal.SIGTERM:
            # a graceful stop says so before the connection drops: the lease ends then, whether a server comes back
            # (a sidecar, started again by the SDK) or not (a private server stopped by SIGTERM: the store is closed)
            said = "the store is stopping"
        else:  # killed, it says nothing: the block's release finds the next server (its store restarts it too)
            said = "the store restarted"
        assert said in err.value.message, err.value.message
    finally:
        await store.close()
        await stop_sidecar(directory)
