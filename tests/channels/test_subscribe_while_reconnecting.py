"""A subscribe made while the SDK reconnects (trial AC): it is answered on the new connection, and what it was
told there (a resume's "behind" notice) is what the subscriber hears, not made again and lost."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest

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


async def test_a_delivery_for_an_id_of_the_last_connection_is_not_handed_to_its_old_subscription(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # contract: CHAN-04
    # contract: CHAN-02
    """Trial EZ: a restarted server gives subscription ids again from the start; a delivery for a subscription made
    on the new connection was handed to an old one that held the same id and was not made again yet: it handled a
    message of another subscription, resumed after it, and was told Missed("reconnect", 0) of what it had lost."""
    from tinystore.client import channels as client_channels
    from tinystore.protocol.channels import Delivery, MessageItem

    release = asyncio.Event()
    resubscribe_all = client_channels._Hub._resubscribe_all

    async def held(hub: Any) -> None:  # (the pass that makes the subscriptions again waits for the test)
        await release.wait()
        await resubscribe_all(hub)

    monkeypatch.setattr(client_channels._Hub, "_resubscribe_all", held)
    async with open_store("sidecar", tmp_path / "s") as store:
        ch = store.channel("c").under("b")
        heard = Heard()
        sub = await ch.subscribe(heard.on_message, on_missed=heard.on_missed)
        await ch.publish("before")
        await eventually(lambda: heard.values == ["before"], what="the first message")
        old_sid = sub._sid
        pid = int((await store.status())["pid"])
        os.kill(pid, signal.SIGKILL)
        assert await gone(pid), f"pid {pid} did not exit"
        await store.status()  # (reconnected: a new server, its ids from the start again)
        hub = client_channels._hub(store)
        # what the new server sends for a subscription of its own that was given the same id
        epoch = (await store.status())["channels"].get("epoch", 1)
        hub._deliver(Delivery(old_sid, [MessageItem(1, f"{epoch}-1", ["b"], msgspec.msgpack.encode("another's"))]))
        await asyncio.sleep(0.1)
        assert heard.values == ["before"], heard.shape()
        release.set()
        await eventually(lambda: len(heard.shape()) == 2, timeout=10, what="the reconnect notice")
        await ch.publish("after")
        try:
            await eventually(lambda: "after" in heard.values, timeout=10, what="the message after the restart")
        except AssertionError:
            raise AssertionError(f"{heard.shape()} {sub.statistics()}") from None
        assert heard.shape() == [("m", "before"), ("missed", "reconnect", None), ("m", "after")]
        await sub.stop()
