"""A branch whose listeners come and go keeps one entry on the engine's idle heap, not one per time its last
listener left: a churn of subscriptions (clients that subscribe and close) held memory for every one of them
until its linger (60 s) ran out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..helpers import open_store
from ..store.test_cancel import wait_for


async def test_subscriptions_that_come_and_go_keep_the_idle_heap_bounded(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        engine = store._core.channels  # type: ignore[attr-defined]
        ch = store.channel("ev").under(1)
        for _ in range(200):
            sub = await ch.subscribe(lambda m: None)
            await sub.stop()
        assert len(engine._idle_heap) <= 2, len(engine._idle_heap)
        got: list[Any] = []
        sub = await ch.subscribe(lambda m: got.append(m.value))  # the branch works on
        try:
            await ch.publish("new")
            await wait_for(lambda: bool(got), "the message")
            assert got == ["new"]
        finally:
            await sub.stop()
