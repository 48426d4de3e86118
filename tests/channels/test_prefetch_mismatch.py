"""A client whose ``channel_prefetch`` is larger than the store's: the store gives each subscription at most its own
window of credit, and the SDK gave credit back in batches of a quarter of its own window, larger than the store's
whole window, so the subscription heard one window and then nothing, without a Missed notice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store


# contract: CHAN-01
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_client_with_a_larger_prefetch_than_the_stores_hears_every_message(mode: str, tmp_path: Path) -> None:
    async with open_store(mode, tmp_path / "d", limits=tinystore.Limits(channel_prefetch=8)) as store:
        other = await tinystore.open(tmp_path / "d")  # the default Limits: channel_prefetch 64
        try:
            got: list[int] = []
            notices: list[tinystore.Missed] = []
            sub = await other.channel("ev").subscribe(lambda m: got.append(m.value), on_missed=notices.append)
            for i in range(30):
                await store.channel("ev").publish(i)
                await asyncio.sleep(0.005)
            for _ in range(200):
                if len(got) == 30:
                    break
                await asyncio.sleep(0.01)
            assert got == list(range(30)) and notices == [], (got, notices, sub.statistics())
            await sub.stop()
        finally:
            await other.close()
