"""A subscribe made while the SDK reconnects (trial AC): it is answered on the new connection, and what it was
told there (a resume's "behind" notice) is what the subscriber hears, not made again and lost."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import tinystore

from ..helpers import drop_connection, gone, open_store
from .support import Heard, eventually


async def test_subscribe_after_an_id_while_a_killed_sidecar_comes_back_is_told_none(tmp_path: Path) -> None:
    # contract: CHAN-04
    # contract: CHAN-02
    """It heard Missed("reconnect", 0): told, as an exact count, that it missed nothing, while the messages after
    its id were gone with the server."""
    async with open_store("sidecar", tmp_path / "s") as store:
        ch = store.channel("c").under("b")
        keep = await ch.subscribe(lambda m: None, on_missed=lambda m: None)
        for round_ in range(3):
            ids = [await ch.publish(f"{round_}-{i}") for i in range(5)]
            pid = int((await store.status())["pid"])
            os.kill(pid, signal.SIGKILL)
            assert await gone(pid), f"pid {pid} did not exit"
            heard = Heard()
            sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed, after=ids[2])  # while reconnecting
            await ch.publish(f"{round_}-new")
            try:
                await eventually(lambda h=heard, v=f"{round_}-new": v in h.values, timeout=10, what="the new message")
            except AssertionError:
                raise AssertionError(
                    f"round {round_}: {heard.shape()} {sub!r} {sub.statistics()} sid {sub._sid} gen {sub._conn_gen}"
                ) from None
            assert heard.shape() == [("missed", "behind", None), ("m", f"{round_}-new")]
            await sub.stop()
        await keep.stop()


async def test_subscribe_after_an_id_while_a_dropped_connection_comes_back_hears_the_rest_exactly(
    tmp_path: Path,
) -> None:
    # contract: CHAN-02
    async with open_store("sidecar", tmp_path / "s") as store:
        ch = store.channel("c").under("b")
        keep = await ch.subscribe(lambda m: None, on_missed=lambda m: None)
        for round_ in range(3):
            ids = [await ch.publish(f"{round_}-{i}") for i in range(5)]
            drop_connection(store)
            heard = Heard()
            sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed, after=ids[2])
            await ch.publish(f"{round_}-new")
            await eventually(lambda h=heard, v=f"{round_}-new": v in h.values, timeout=10, what="the new message")
            await asyncio.sleep(0.05)
            assert heard.shape() == [("m", f"{round_}-3"), ("m", f"{round_}-4"), ("m", f"{round_}-new")]
            await sub.stop()
        await keep.stop()
        assert isinstance(keep, tinystore.Subscription)
