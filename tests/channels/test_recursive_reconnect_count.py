"""A recursive subscription that reconnects is told how many messages it missed: 0 when nothing was published,
though branches below it have messages from before it subscribed (it was told ``None``: "cannot tell"); never 0
when something was published meanwhile, also where nobody listened."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

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


# contract: CHAN-02
# contract: CHAN-04
@pytest.mark.parametrize("recursive", [False, True])
async def test_messages_counted_missed_at_one_reconnect_are_not_counted_again_at_the_next(
    tmp_path: Path, recursive: bool
) -> None:
    # from trial BC: a recursive subscription resumed from the last message it handled on each branch, so the
    # second of two reconnects counted the same lost messages again (delivered + missed = 19 of 11 published)
    limits = tinystore.Limits(channel_log=2, channel_prefetch=4)
    async with open_store("private", tmp_path / "d", limits=limits) as store:
        client = await tinystore.open(tmp_path / "d")
        try:
            got: list[object] = []
            notices: list[tinystore.Missed] = []
            gate = asyncio.Event()

            async def handler(m: tinystore.Message[object]) -> None:
                got.append(m.value)
                await gate.wait()

            events = client.channel("c")
            if recursive:
                sub = await events.under("a").subscribe(handler, on_missed=notices.append, recursive=True)
            else:
                sub = await events.under("a", "x").subscribe(handler, on_missed=notices.append)
            ch = store.channel("c").under("a", "x")
            await ch.publish(0)
            for _ in range(500):
                if got:
                    break
                await asyncio.sleep(0.01)
            for i in range(1, 11):  # the handler holds message 0: 8 of these go from the log of 2
                await ch.publish(i)
            await asyncio.sleep(0.1)
            for k in (1, 2):
                client.transport.abort()  # type: ignore[attr-defined]  # a brief network fault
                for _ in range(1000):
                    if sub.reconnects >= k:
                        break
                    await asyncio.sleep(0.01)
            gate.set()
            for _ in range(500):
                if got and got[-1] == 10:
                    break
                await asyncio.sleep(0.01)
            await sub.stop()
            told = [n.count for n in notices]
            assert told == [8, 0], told
            assert len(got) + sum(c or 0 for c in told) == 11, (got, told)
        finally:
            await client.close()


# contract: CHAN-04
async def test_after_a_restart_the_next_reconnect_is_counted_exactly_again(tmp_path: Path) -> None:
    # from trial BE: after a server restart (told None, rightly) a recursive subscription kept resuming after the
    # ids of the last server run, so every later reconnect was told None too, though nothing was lost
    import os
    import signal

    async with open_store("private", tmp_path / "d") as store:
        notices: list[tinystore.Missed] = []
        heard: list[object] = []
        ev = store.channel("events")
        sub = await ev.under("a").subscribe(heard.append, on_missed=notices.append, recursive=True)
        await ev.under("a", "x").publish(1)
        for _ in range(300):
            if heard:
                break
            await asyncio.sleep(0.01)
        child = store._child
        assert child is not None
        os.kill(child.pid, signal.SIGKILL)  # the server restarts
        for _ in range(1000):
            if notices:
                break
            await asyncio.sleep(0.01)
        assert notices == [tinystore.Missed("reconnect", None)], notices
        notices.clear()
        await _drop_and_wait(store, notices)  # a brief network fault: nothing was published, nothing lost
        assert notices == [tinystore.Missed("reconnect", 0)], notices
        notices.clear()
        await ev.under("a", "y").publish(2)  # a new branch of this run, heard
        for _ in range(300):
            if len(heard) == 2:
                break
            await asyncio.sleep(0.01)
        await _drop_and_wait(store, notices)
        assert notices == [tinystore.Missed("reconnect", 0)], notices
        await sub.stop()


# contract: CHAN-02
# contract: CHAN-04
async def test_messages_received_and_not_handled_on_a_new_branch_come_again_after_a_reconnect(tmp_path: Path) -> None:
    # from trial BF: the handler was busy with a/x's message while a/y's first three waited in the SDK's buffer;
    # the resubscription did not list a/y, was told None, and those three, still in the log, never came
    async with open_store("private", tmp_path / "d") as store:
        ev = store.channel("events")
        notices: list[tinystore.Missed] = []
        heard: list[object] = []
        gate = asyncio.Event()

        async def handler(m: tinystore.Message[object]) -> None:
            heard.append(m.value)
            if m.value == "x1":
                await gate.wait()

        sub = await ev.under("a").subscribe(handler, on_missed=notices.append, recursive=True)
        await ev.under("a", "x").publish("x1")
        for _ in range(300):
            if heard:
                break
            await asyncio.sleep(0.01)
        for i in range(3):
            await ev.under("a", "y").publish(f"y{i}")
        await asyncio.sleep(0.2)  # received, waiting behind x1's handler
        await _drop_and_wait(store, notices)
        gate.set()
        for _ in range(300):
            if len(heard) == 4:
                break
            await asyncio.sleep(0.01)
        assert notices == [tinystore.Missed("reconnect", 0)], notices
        assert heard == ["x1", "y0", "y1", "y2"], heard
        await sub.stop()


# contract: CHAN-02
async def test_a_notice_of_the_store_not_told_yet_keeps_its_count_across_a_reconnect(tmp_path: Path) -> None:
    # from trial BH: a "behind" notice and a new branch's first message waited unhandled; the resubscription
    # listed that branch after the message, past what the dropped notice counted, and was told 0: lost silently
    limits = tinystore.Limits(channel_log=2, channel_prefetch=4)
    async with open_store("private", tmp_path / "d", limits=limits) as store:
        client = await tinystore.open(tmp_path / "d")
        try:
            heard: list[str] = []
            notices: list[tinystore.Missed] = []
            gate1, gate2 = asyncio.Event(), asyncio.Event()

            async def handler(m: tinystore.Message[str]) -> None:
                heard.append(m.value)
                if m.value == "x1":
                    await gate1.wait()
                if m.value == "x2":
                    await gate2.wait()

            sub = await client.channel("c").under("a").subscribe(handler, on_missed=notices.append, recursive=True)
            pub = store.channel("c").under("a")
            await pub.under("x").publish("x1")
            while heard != ["x1"]:
                await asyncio.sleep(0.01)
            for i in (2, 3, 4):  # the credit (prefetch 4) used up
                await pub.under("x").publish(f"x{i}")
            await asyncio.sleep(0.2)
            for i in range(1, 6):  # not sent: y1..y3 go from the log of 2
                await pub.under("y").publish(f"y{i}")
            await asyncio.sleep(0.2)
            gate1.set()  # a credit back: the store sends "behind 3" and y4; the handler holds x2
            while "x2" not in heard:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            await _drop_and_wait(client, [])
            while sub.reconnects < 1:
                await asyncio.sleep(0.01)
            gate2.set()
            for _ in range(300):
                if "y5" in heard and notices:
                    break
                await asyncio.sleep(0.01)
            await sub.stop()
            counts = [n.count for n in notices]
            assert len(heard) == len(set(heard)), heard
            known = sum(c for c in counts if c is not None)
            if None in counts:
                assert len(heard) + known <= 9, (heard, counts)
            else:
                assert len(heard) + known == 9, (heard, counts)
        finally:
            await client.close()


# contract: CHAN-02
# contract: CHAN-04
async def test_a_notice_of_the_sdks_own_waiting_does_not_leave_a_new_branch_unlisted(tmp_path: Path) -> None:
    # from trial BI: behind the first reconnect's notice (the SDK's own, not told yet), a new branch's messages
    # waited unhandled; at a second drop the branch was left unlisted, told None, and they never came again
    async with open_store("embedded", tmp_path / "d") as owner:
        client = await tinystore.open(tmp_path / "d")
        try:
            heard: list[str] = []
            notices: list[tinystore.Missed] = []
            gate = asyncio.Event()

            async def handler(m: tinystore.Message[str]) -> None:
                heard.append(m.value)
                if m.value == "x1":
                    await gate.wait()

            sub = await client.channel("c").under("a").subscribe(handler, on_missed=notices.append, recursive=True)
            pub = owner.channel("c").under("a")
            await pub.under("x").publish("x1")
            while heard != ["x1"]:
                await asyncio.sleep(0.01)
            await _drop_and_wait(client, [])  # the handler holds x1: the reconnect's notice waits
            while sub.reconnects < 1:
                await asyncio.sleep(0.01)
            for i in range(3):
                await pub.under("y").publish(f"y{i}")
            await asyncio.sleep(0.3)
            await _drop_and_wait(client, [])
            while sub.reconnects < 2:
                await asyncio.sleep(0.01)
            gate.set()
            for _ in range(300):
                if len(heard) >= 4 and len(notices) >= 2:
                    break
                await asyncio.sleep(0.01)
            await sub.stop()
            assert heard == ["x1", "y0", "y1", "y2"], (heard, notices)
            assert [n.count for n in notices] == [0, 0], notices
        finally:
            await client.close()
