"""A graceful stop of the store ends every lease held through it at once (LOCK-07: after a restart nobody holds
anything), and a lost lease's block raises without waiting for the network.

From a tester's report: with ``tinystore serve`` stopped by SIGTERM and started again, a waiter entered its block
before the holder's block was cancelled (2 runs of 3): the holder's SDK learnt of the restart only when its own
connection reconnected, and the waiter's connection reconnected first. And on a silent network, ``LostError`` left
the ``async with`` 0.5 to 1 s after the block was cancelled: its ``__aexit__`` waited for the release on the dead
connection, so ``except LostError:`` code ran after the next holder had started.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import tinystore
from tinystore import LostError

from ..helpers import ServerProcess


class Timeline:
    """What happened, in order, with the loop's time."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def __call__(self, what: str) -> None:
        self.events.append((what, asyncio.get_running_loop().time()))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def at(self, what: str) -> float:
        return next(t for name, t in self.events if name == what)


# contract: LOCK-05
async def test_lost_error_leaves_the_block_at_once_when_the_store_does_not_answer(tmp_path: Path) -> None:
    """The store stopped answering (SIGSTOP: a silent network): the SDK declares the lease lost, cancels the block,
    and LostError comes out of the ``async with`` at once; the release waits in the background (the store's close
    waits for it, a few seconds at most)."""
    server = ServerProcess(tmp_path / "store").start()
    assert server.proc is not None
    try:
        store = await tinystore.open(tmp_path / "store")
        timeline = Timeline()
        try:
            with pytest.raises(LostError, match="no renewal succeeded for"):
                async with store.lock("l", ttl="3s").hold("k"):
                    server.proc.send_signal(signal.SIGSTOP)
                    try:
                        await asyncio.sleep(30)
                    finally:
                        timeline("block cancelled")
            timeline("LostError")
            assert timeline.at("LostError") - timeline.at("block cancelled") < 0.2, timeline.events
        finally:
            server.proc.send_signal(signal.SIGCONT)
            await asyncio.wait_for(store.close(), 15)
    finally:
        server.stop()
