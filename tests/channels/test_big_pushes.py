"""Deliveries fit a frame whatever the limits: with large messages and a large prefetch, a subscription's credit's
worth of messages would outgrow a frame; the store cuts its pushes by bytes rather than break the connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tinystore import Limits, Message, Missed

from ..helpers import open_store


@pytest.mark.parametrize("mode", ["private", "sidecar"])
async def test_a_credit_of_large_messages_is_delivered_in_pushes_that_fit(tmp_path: Path, mode: str) -> None:
    limits = Limits(
        frame_body_bytes=4 * 1024 * 1024,
        channel_message_bytes=1024 * 1024,
        channel_prefetch=32,
        channel_log_bytes=96 * 1024 * 1024,
        channel_total_bytes=128 * 1024 * 1024,
    )
    async with open_store(mode, tmp_path / mode, limits=limits) as store:
        ch = store.channel("big").under(1)
        gate = asyncio.Event()
        got: list[int] = []
        missed: list[Missed] = []

        async def handler(m: Message[object]) -> None:
            await gate.wait()
            got.append(m.seq)

        sub = await ch.subscribe(handler, on_missed=missed.append)
        # 32 go out at once (the credit), one push each; the next 20 wait in the store. Once the handler runs,
        # credit comes back in one grant, and those 20 MB are due at once: in one push they would be over the
        # SDK's frame limit (16 MiB), and the connection would break and break again
        for _ in range(52):
            await ch.publish("x" * (1000 * 1000))
        gate.set()
        async with asyncio.timeout(60):
            while len(got) < 52:
                await asyncio.sleep(0.02)
        assert got == list(range(1, 53)) and missed == []
        await sub.stop()
