"""A branch heard only by recursive subscriptions is forgotten by their sweep once they are caught up (a bound on
what a long-lived recursive subscription keeps alive). Made again before anything else was published on it, its
seqs go on where they stopped, so the ids of its last messages still name a place: a resume with ``after=`` (an
SSE Last-Event-ID) and a recursive subscription's reconnect stay exact."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tinystore

from ..helpers import open_store

T0 = datetime(2031, 1, 1, tzinfo=UTC)


# contract: CHAN-04
async def test_a_resume_after_an_id_of_a_swept_branch_gets_what_its_log_holds(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "d", clock=T0) as store:
        ev = store.channel("events")
        every_chat = await ev.subscribe(lambda m: None, recursive=True)  # listens all along
        heard: list[str] = []
        tab = await ev.under(7).subscribe(lambda m: heard.append(m.id))
        await ev.under(7).publish({"n": 1})
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.01)
        await tab.stop()  # the tab goes away
        await store.clock.advance("61s")
        await store.clock.advance("61s")  # quiet for two lingers: the sweep forgets branch 7
        await store.channel("other").under("x").publish(1)  # published where nobody listens
        await ev.under(7).publish({"n": 2})
        await ev.under(7).publish({"n": 3})
        got: list[Any] = []
        notices: list[tinystore.Missed] = []
        again = await ev.under(7).subscribe(lambda m: got.append(m.value), on_missed=notices.append, after=heard[-1])
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        assert (got, notices) == ([{"n": 2}, {"n": 3}], []), (got, notices)
        await again.stop()
        await every_chat.stop()


# contract: CHAN-04
async def test_a_recursive_subscription_reconnecting_after_the_sweep_is_told_it_missed_nothing(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "d", clock=T0) as store:
        client = await tinystore.open(tmp_path / "d")  # another connection, to drop
        try:
            heard: list[str] = []
            notices: list[tinystore.Missed] = []
            sub = await client.channel("events").subscribe(
                lambda m: heard.append(m.id), on_missed=notices.append, recursive=True
            )
            await store.channel("events").under(7).publish({"n": 1})
            for _ in range(100):
                if heard:
                    break
                await asyncio.sleep(0.01)
            await store.clock.advance("61s")
            await store.clock.advance("61s")  # the sweep forgets branch 7 (all of it was delivered)
            client.transport.abort()  # type: ignore[attr-defined]  # a brief network fault; nothing is published
            for _ in range(300):
                if notices:
                    break
                await asyncio.sleep(0.01)
            assert notices == [tinystore.Missed("reconnect", 0)], notices
            await store.channel("events").under(7).publish({"n": 2})  # heard again, from where it stopped
            for _ in range(100):
                if len(heard) == 2:
                    break
                await asyncio.sleep(0.01)
            assert len(heard) == 2
            await sub.stop()
        finally:
            await client.close()
