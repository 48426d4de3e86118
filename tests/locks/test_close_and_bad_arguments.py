"""Closing the store while a task waits in line for a key; arguments that no connection could carry are refused
with InvalidError in every mode (and never fail other callers' calls)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store
from tinystore import ClosedError, InvalidError, LostError

MODES = ["embedded", "private", "tcp"]


# contract: LOCK-01
@pytest.mark.parametrize("mode", MODES)
async def test_closing_the_store_gives_no_lease_to_its_own_waiters(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        lock = store.lock("cl", ttl="5s")
        entered = asyncio.Event()
        seen: dict[str, BaseException | str] = {}

        async def holder() -> None:
            try:
                async with lock.hold(1):
                    entered.set()
                    await asyncio.sleep(30)
            except BaseException as exc:
                seen["holder"] = exc

        async def waiter() -> None:
            await entered.wait()
            try:
                async with lock.hold(1):
                    seen["waiter"] = "ran its block while the store was closing"
            except BaseException as exc:
                seen["waiter"] = exc

        tasks = [asyncio.ensure_future(holder()), asyncio.ensure_future(waiter())]
        await entered.wait()
        await asyncio.sleep(0.2)  # the waiter is in line
        await store.close()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert isinstance(seen["holder"], LostError)
        assert isinstance(seen["waiter"], ClosedError), seen["waiter"]
        assert "closed while waiting in line" in seen["waiter"].message


# contract: LOCK-03
@pytest.mark.parametrize("mode", ["private", "sidecar", "tcp"])
async def test_closing_the_store_as_a_hold_is_sent_leaves_no_unretrieved_future(tmp_path: Path, mode: str) -> None:
    # trial BU: the caller got ClosedError, and asyncio logged "Future exception was never retrieved ... ClosedError:
    # the store was closed while waiting in line" for the ask's own future, which the first ask of a turn never awaits
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async with open_store(mode, tmp_path / "s") as store:
            lock = store.lock("l", ttl="5s")

            async def holder() -> None:
                async with lock.hold(1):
                    await asyncio.sleep(30)

            task = asyncio.ensure_future(holder())
            await asyncio.sleep(0)  # the hold is on its way
            await store.close()
            got = (await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10))[0]
            assert isinstance(got, ClosedError) and "closed while waiting in line" in got.message, got
            del task, got
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(handler)
    assert reported == []


@pytest.mark.parametrize("mode", MODES)
async def test_arguments_no_connection_can_carry_are_invalid_in_every_mode(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        lock = store.lock("b")
        with pytest.raises(InvalidError, match="not valid Unicode"):
            async with lock.hold("\ud800"):
                pass
        with pytest.raises(InvalidError, match="wait: a duration is at most 100 years"):
            async with lock.hold("k", wait=1e300):
                pass
        with pytest.raises(InvalidError, match=r"limit .* must be an int from 1 to 1000000"):
            store.semaphore("s", limit=2**70)
        with pytest.raises(InvalidError, match=r"ttl: a duration is at most 100 years \(36500d\), got 1e\+300$"):
            store.lock("t", ttl=1e300)
        channel = store.channel("c")
        with pytest.raises(InvalidError, match="not valid Unicode"):
            channel.under("\ud800")
        with pytest.raises(InvalidError, match="does not encode"):
            await channel.publish("\ud800")

        # calls made in one loop turn around a bad one each get their own outcome
        async def hold(key: str) -> str:
            async with lock.hold(key):
                return key

        got = await asyncio.gather(hold("a"), hold("\udfff"), hold("c"), return_exceptions=True)
        assert got[0] == "a" and got[2] == "c"
        assert isinstance(got[1], InvalidError)
        ids = await asyncio.gather(
            channel.under("a").publish(1),
            channel.under("b").publish("\udc80"),
            channel.under("c").publish(3),
            return_exceptions=True,
        )
        assert isinstance(ids[0], str) and isinstance(ids[2], str) and isinstance(ids[1], InvalidError)


# contract: LOCK-03
async def test_an_awaited_hold_shows_the_call_as_made(tmp_path: Path) -> None:
    # trial BU: `await lock.hold(1)` was told to write `async with lock.hold('1') as lease:`; a semaphore's
    # try_hold was shown as a lock's hold
    async with open_store("embedded", tmp_path / "s") as store:
        lock, sem = store.lock("nightly"), store.semaphore("renders", limit=2)
        said = "is used with `async with`, not awaited: `async with"
        for hold, call in [
            (lock.hold(1), "lock nightly: hold() {} lock.hold(1) as lease:`"),
            (lock.hold("1", wait=0), "lock nightly: hold() {} lock.hold(1) as lease:`"),
            (lock.try_hold(-7), "lock nightly: try_hold() {} lock.try_hold(-7) as lease:`"),
            (lock.hold("007"), "lock nightly: hold() {} lock.hold('007') as lease:`"),
            (sem.try_hold("k"), "semaphore renders: try_hold() {} semaphore.try_hold('k') as permit:`"),
        ]:
            with pytest.raises(TypeError) as info:
                await hold
            assert str(info.value) == call.format(said)


# contract: LOCK-01
async def test_hold_awaited_or_used_with_plain_with_says_async_with(tmp_path: Path) -> None:
    # from trial BG: Python's own TypeErrors named a private class (Hold) and gave no hint
    store = await tinystore.open(tmp_path / "s", embedded=True)
    try:
        lock = store.lock("nightly")
        with pytest.raises(TypeError, match="async with"):
            await lock.try_hold("k")
        with pytest.raises(TypeError, match="async with"):
            with lock.hold("k"):
                pass
        async with lock.hold("k") as lease:  # nothing was held by the mistakes
            assert lease.fence
        sem = store.semaphore("renders", limit=2)
        with pytest.raises(TypeError, match=r"^semaphore renders: .*async with"):
            await sem.try_hold("k")
    finally:
        await store.close()


# contract: LOCK-07
async def test_an_embedded_store_closing_gives_no_lease_to_another_clients_waiter(tmp_path: Path) -> None:
    """From trial DT: an embedded store being closed, while a holder of its own ran its block's clean-up, gave the
    key to another client's waiter, whose block began only to be told at once that the store was stopping. No
    lease is given once the store begins to stop: the waiter gets the key from the next server."""
    from tests.helpers import stop_sidecar

    directory = tmp_path / "s"
    embedded = await tinystore.open(directory, embedded=True)
    other = await tinystore.open(directory, idle="5s")  # (through the embedded store's socket)
    closed = asyncio.Event()
    entered = asyncio.Event()
    seen: list[tuple[bool, bool, int]] = []  # (closed yet, lost at once, fence) of the other's block
    fences: list[int] = []
    try:

        async def holder() -> None:
            with contextlib.suppress(BaseException):
                async with embedded.lock("sg", ttl="3s").hold("k") as lease:
                    fences.append(lease.fence)
                    entered.set()
                    try:
                        await asyncio.sleep(30)
                    finally:
                        await asyncio.sleep(0.3)  # its clean-up, as the store closes

        async def waiter() -> None:
            async with other.lock("sg", ttl="3s").hold("k", wait="20s") as lease:
                seen.append((closed.is_set(), lease.lost.is_set(), lease.fence))

        held = asyncio.create_task(holder())
        await entered.wait()
        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0.2)
        await embedded.close()
        closed.set()
        embedded = await tinystore.open(directory, embedded=True)  # the next server (its socket the same)
        await asyncio.wait_for(waiting, 20)
        await held
        ((after_close, lost, fence),) = seen
        assert after_close and not lost, seen
        assert fence > fences[0]
    finally:
        await other.close()
        await embedded.close()
        await stop_sidecar(directory)


async def test_an_embedded_store_closing_still_gives_keys_to_its_own_code(tmp_path: Path) -> None:
    """From trial DV: with no lease given at all once the store began to stop, its own job handlers (running in
    their grace) and its blocks' clean-up were told a free key was held: a handler waiting for one failed its
    attempt after its whole wait, one using try_hold skipped its work and ended succeeded, and a clean-up
    taking a key kept the close 5 s. The store's own code is served until the store is stopped."""
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    db = await store.database("app")
    queue = store.queue("work", database=db)
    per_user = store.lock("per-user")
    started = asyncio.Event()
    outcomes: list[str] = []

    async def handler(value: int, run: object) -> str:
        started.set()
        await asyncio.sleep(0.3)  # the store closes meanwhile
        async with per_user.try_hold(str(value)) as lease:
            outcomes.append("skipped" if lease is None else "done")
        async with per_user.hold(str(value), wait=3):
            outcomes.append("waited")
        return "ok"

    job = await queue.add(1)
    worker = queue.work(handler)
    await started.wait()
    t0 = asyncio.get_running_loop().time()
    await store.close()
    assert asyncio.get_running_loop().time() - t0 < 2.5
    assert outcomes == ["done", "waited"]
    del worker
    store = await tinystore.open(tmp_path / "s", embedded=True, serve=False)
    try:
        got = await store.queue("work", database=await store.database("app")).get(job)
        assert got is not None and got.state == "succeeded", got
    finally:
        await store.close()


async def test_another_clients_try_as_an_embedded_store_closes_is_answered_by_the_next_server(tmp_path: Path) -> None:
    """From trial DV: another client's try_hold on a free key, while the store closed, came back None (held), and
    a hold with a wait of 0 raised InUseError "held". It waits for the next server, which answers it truly."""
    from tests.helpers import stop_sidecar

    directory = tmp_path / "s"
    embedded = await tinystore.open(directory, embedded=True)
    other = await tinystore.open(directory, idle="5s")
    entered = asyncio.Event()
    try:

        async def holder() -> None:
            with contextlib.suppress(BaseException):
                async with embedded.lock("a", ttl="3s").hold("k"):
                    entered.set()
                    try:
                        await asyncio.sleep(30)
                    finally:
                        await asyncio.sleep(0.5)  # its clean-up, as the store closes

        held = asyncio.create_task(holder())
        await entered.wait()
        closing = asyncio.create_task(embedded.close())
        await asyncio.sleep(0.2)  # the store has begun to stop; its holder runs its clean-up

        async def try_free() -> bool:
            async with other.lock("free", ttl="3s").try_hold("z") as lease:
                return lease is not None

        trying = asyncio.create_task(try_free())
        await closing
        embedded = await tinystore.open(directory, embedded=True)  # the next server
        assert await asyncio.wait_for(trying, 20) is True
        await held
    finally:
        await other.close()
        await embedded.close()
        await stop_sidecar(directory)


# contract: LOCK-01
@pytest.mark.parametrize("mode", ["sidecar", "tcp"])
@pytest.mark.parametrize("wait", ["60s", None])
async def test_a_close_ends_a_wait_in_line_behind_another_client(tmp_path: Path, mode: str, wait: str | None) -> None:
    """Trial HR: a `hold(key, wait=...)` in line behind another client's lease asked again when its store closed,
    and waited out its whole wait (10 s without one), then raised UnavailableError ("could not be reached")."""
    async with open_store(mode, tmp_path / "s") as holder_store:
        if mode == "tcp":
            admin = (tmp_path / "tokens").read_text().split()[1]
            waiter_store = await tinystore.connect(holder_store.transport.where, token=admin)
        else:
            waiter_store = await tinystore.open(tmp_path / "s")
        async with holder_store.lock("cl", ttl="30s").hold("k"):
            waiter_lock = waiter_store.lock("cl", ttl="30s")

            async def waiter() -> None:
                async with waiter_lock.hold("k", wait=wait):
                    raise AssertionError("ran its block while another client held the key")

            task = asyncio.ensure_future(waiter())
            await asyncio.sleep(0.3)  # (in line at the store)
            await waiter_store.close()
            done, _ = await asyncio.wait([task], timeout=3)
            assert done, "the waiter still waited after its store was closed"
            got = task.exception()
            assert isinstance(got, ClosedError) and "closed while waiting in line" in got.message, got


# contract: LOCK-01
async def test_a_close_after_a_dropped_connection_ends_a_wait_in_line_with_closed_error(tmp_path: Path) -> None:
    """Trial HU: after the connection dropped, a close run by another task (a shutdown handler, `wait_for`) cancelled
    the task of a hold waiting in line (the abandon of its old ticket, a task of the store's, was cancelled under
    it): CancelledError, which a TaskGroup takes for its own, rather than ClosedError."""
    from ..helpers import drop_connection

    async with open_store("sidecar", tmp_path / "s") as holder_store:
        waiter_store = await tinystore.open(tmp_path / "s")
        async with holder_store.lock("cl", ttl="30s").hold("k"):

            async def waiter() -> None:
                async with waiter_store.lock("cl", ttl="30s").hold("k", wait="60s"):
                    raise AssertionError("ran its block while another client held the key")

            task = asyncio.ensure_future(waiter())
            await asyncio.sleep(0.3)  # (in line at the store)
            drop_connection(waiter_store)
            await asyncio.wait_for(waiter_store.close(), 20)
            done, _ = await asyncio.wait([task], timeout=5)
            assert done and not task.cancelled(), "the waiter's task was cancelled by the close"
            got = task.exception()
            assert isinstance(got, ClosedError), got


# contract: LOCK-01
async def test_a_close_with_the_server_down_does_not_wait_to_leave_the_lines(tmp_path: Path) -> None:
    """Trial HU: with the server down, a hold waiting for it made the close take 5 s (it asked the store, which was
    not there, to take its ask out of a line it had left with the connection)."""
    from ..helpers import ServerProcess, write_tokens

    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "s", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        store = await tinystore.connect(server.tcp, token=admin)
        await store.status()
    finally:
        server.stop()

    async def waiter() -> None:
        async with store.lock("cl", ttl="30s").hold("k", wait="60s"):
            raise AssertionError("held with no server")

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0.3)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await asyncio.wait_for(store.close(), 20)
    assert loop.time() - began < 2.5, loop.time() - began
    done, _ = await asyncio.wait([task], timeout=5)
    assert done and isinstance(task.exception(), ClosedError), task
