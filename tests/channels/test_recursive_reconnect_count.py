"""A recursive subscription that reconnects is told how many messages it missed: 0 when nothing was published,
though branches below it have messages from before it subscribed (it was told ``None``: "cannot tell"); never 0
when something was published meanwhile, also where nobody listened."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tinystore

from ..helpers import open_store


async def _drop_and_wait(client: tinystore.Store, notices: list[tinystore.Missed], during: object = None) -> None:
    client.transport.abort()  # type: ignore[attr-defined]  # a brief network fault
    if during is not None:
        await during  # type: ignore[misc]
    for _ in range(300):
        if notices:
            return
        await asyncio.sleep(0.01)


# contract: CHAN-04
async def test_branches_with_messages_from_before_it_subscribed_count_zero_on_a_reconnect(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "d") as store:
        ev = store.channel("events")
        tab = await ev.under(7).subscribe(lambda m: None)  # chat 7 is listened to, and has a message ...
        await ev.under(7).publish({"n": 1})
        await ev.under(8).publish({"n": 1})  # (and one where nobody listens)
        client = await tinystore.open(tmp_path / "d")
        try:
            notices: list[tinystore.Missed] = []
            sub = await client.channel("events").subscribe(lambda m: None, on_missed=notices.append, recursive=True)
            await asyncio.sleep(0.05)  # ... from before the recursive subscription
            await _drop_and_wait(client, notices)
            assert notices == [tinystore.Missed("reconnect", 0)], notices
            notices.clear()
            await _drop_and_wait(client, notices)  # and again, from the subscription made at the reconnect
            assert notices == [tinystore.Missed("reconnect", 0)], notices
            await sub.stop()
        finally:
            await client.close()
            await tab.stop()


# contract: CHAN-04
async def test_a_message_published_during_the_drop_is_never_counted_zero(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "d") as store:
        client = await tinystore.open(tmp_path / "d")
        try:
            for i in range(5):
                notices: list[tinystore.Missed] = []
                heard: list[object] = []
                sub = await client.channel("events").subscribe(heard.append, on_missed=notices.append, recursive=True)
                await _drop_and_wait(client, notices, store.channel("events").under(f"new-{i}").publish({"n": i}))
                assert notices and notices[0].reason == "reconnect", notices
                assert notices[0].count != 0 or heard, (i, notices)  # heard again, or counted, or "cannot tell"
                await sub.stop()
        finally:
            await client.close()
