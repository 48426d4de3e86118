"""A hold cancelled while it gets (or lets go of) the key has let go of it by the time its task has ended: the
next try_hold gets the key at once (LOCK-04), with no release left in flight behind the cancel."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store


# contract: LOCK-04
@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_a_cancelled_hold_has_let_go_when_its_task_ends(tmp_path: Path, mode: str) -> None:
    rng = random.Random(4)
    async with open_store(mode, tmp_path / "store") as store:
        other = await tinystore.open(tmp_path / "store")
        try:
            mine, theirs = store.lock("c", ttl="10s"), other.lock("c", ttl="10s")
            stuck = []
            for r in range(120):
                key = f"k{r}"
                go = asyncio.Event()

                async def holder(key: str = key, go: asyncio.Event = go) -> None:
                    async with theirs.hold(key):
                        await go.wait()

                async def waiter(key: str = key) -> None:
                    async with mine.hold(key, wait="5s"):
                        await asyncio.sleep(0)

                held = asyncio.create_task(holder())
                await asyncio.sleep(0.005)
                waiting = asyncio.create_task(waiter())
                await asyncio.sleep(0.005)
                go.set()
                await asyncio.sleep(rng.uniform(0, 0.004))  # the cancel lands at any point of the hand-over
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                await held
                async with theirs.try_hold(key) as lease:
                    if lease is None:
                        stuck.append(r)
            assert stuck == [], f"the key was still held after the cancelled task ended, in rounds {stuck}"
        finally:
            await other.close()
