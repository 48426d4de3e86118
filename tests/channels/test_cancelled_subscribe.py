"""A subscribe cancelled while its call is out leaves no subscription in the store: the one the store made after
all is ended as soon as its answer comes, without waiting for a message on its branch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store


async def _subscriptions(store: tinystore.Store) -> int:
    return int((await store.status())["channels"]["subscriptions"])


# contract: CHAN-01
@pytest.mark.parametrize("mode", ["embedded", "private", "sidecar"])
async def test_a_cancelled_subscribe_leaves_no_subscription(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        events = store.channel("ev", dict)
        heard: list[object] = []
        for delay in (0, 0, 0.0005, 0.001, 0.002):
            task = asyncio.ensure_future(events.under(1).subscribe(heard.append))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                sub = await task
            except asyncio.CancelledError:
                continue
            await sub.stop()  # the subscribe was done before the cancel: an ordinary subscription
        for _ in range(200):
            if await _subscriptions(store) == 0:
                break
            await asyncio.sleep(0.01)
        assert await _subscriptions(store) == 0
        # and nothing is delivered for them
        await events.under(1).publish({"n": 1})
        await asyncio.sleep(0.05)
        assert heard == []
        live = await events.under(1).subscribe(heard.append)
        await events.under(1).publish({"n": 2})
        for _ in range(200):
            if heard:
                break
            await asyncio.sleep(0.01)
        assert len(heard) == 1
        await live.stop()


# contract: CHAN-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_an_each_loop_cancelled_while_it_waits_ends_its_subscription_though_its_task_is_kept(
    tmp_path: Path, mode: str
) -> None:
    """docs/channels.md: a cancel that leaves the loop stops the subscription at once when nothing else holds the
    iterator. Trial EN: a task cancelled while it waited for the next message, kept (a dict of per-tab tasks) and
    not awaited, kept the iterator, and the subscription, in its error's traceback."""
    async with open_store(mode, tmp_path / "s") as store:
        events = store.channel("ev")

        async def consume() -> None:
            async for _ in events.under(1).each():
                pass

        tasks = {"tab-1": asyncio.ensure_future(consume())}
        async with asyncio.timeout(10):
            while await _subscriptions(store) == 0:
                await asyncio.sleep(0.01)
        tasks["tab-1"].cancel()
        await asyncio.wait(tasks.values())
        async with asyncio.timeout(10):
            while await _subscriptions(store):
                await asyncio.sleep(0.01)
        assert tasks["tab-1"].cancelled()

        # an iterator held and polled under a timeout goes on after each cancel
        it = events.under(2).each()
        for _ in range(3):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await anext(it)
        await events.under(2).publish({"n": 1})
        assert (await anext(it)).value == {"n": 1}
        await it.aclose()
