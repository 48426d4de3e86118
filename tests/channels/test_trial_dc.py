"""Trial DC: a cancelled ``sub.stop()`` left the subscription in the store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tests.helpers import open_store


async def _subscriptions(store: tinystore.Store) -> int:
    for _ in range(50):
        count = int((await store.status())["channels"]["subscriptions"])
        if count == 0:
            return 0
        await asyncio.sleep(0.05)
    return count


# contract: CHAN-08
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_cancelled_stop_still_ends_the_subscription_in_the_store(tmp_path: Path, mode: str) -> None:
    # sub.active was False, but the store kept it (against the subscriptions limit, its branch kept) until the
    # connection closed, and a second stop() did nothing
    async with open_store(mode, tmp_path / "s") as store:
        channel = store.channel("r")
        # a stop bounded by wait_for inside the handler: the stop cancels the handler, which cancels the stop
        holder: dict[str, Any] = {}

        async def handler(message: tinystore.Message[Any]) -> None:
            if message.value == 2:
                await asyncio.wait_for(holder["sub"].stop(), 3)

        holder["sub"] = await channel.under("a").subscribe(handler)
        for i in range(5):
            await channel.under("a").publish(i)
        await asyncio.sleep(0.3)
        assert not holder["sub"].active
        assert await _subscriptions(store) == 0
        # a task running stop() cancelled at once
        sub = await channel.under("b").subscribe(lambda m: None)
        task = asyncio.create_task(sub.stop())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert not sub.active
        assert await _subscriptions(store) == 0
