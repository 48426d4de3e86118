"""The situations of issue 4, reported against other lock services: holders that freeze (separate processes
stopped with SIGSTOP), waits that give up on time, the seed's fenced write, fences across restarts, and the
seed's summary snippet as written."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import InUseError

from ..helpers import open_store
from .support import actor, holders, other_client

MIGRATIONS = [
    ("001_chats.sql", "create table chats (id integer primary key, title text);\ninsert into chats (id) values (7);"),
    (
        "002_summary.sql",
        "alter table chats add column summary text;\n"
        "alter table chats add column summary_fence text not null default '';",
    ),
]


async def _until(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


# contract: LOCK-05
async def test_a_holder_frozen_past_its_ttl_loses_the_key_and_its_wake_up_changes_nothing(tmp_path: Path) -> None:
    """A holds with a 1 s ttl and is stopped (SIGSTOP) for 1.5 s; B takes the key; A wakes and releases: A's
    release changes nothing, a third client's try_hold gets None, B still holds and its release works; A's
    renewal after expiry fails and A is told (LostError)."""
    directory = tmp_path / "store"
    async with open_store("sidecar", directory) as store, other_client(store) as third:
        lock = store.lock("summaries", ttl="1s")
        async with actor(mode="freeze", dir=str(directory), lock="summaries", key="7", ttl="1s") as a:
            held = await a.event("held")
            a.signal(signal.SIGSTOP)
            stopped = time.monotonic()
            # B waits in line and gets the key once A's lease ran out (1 s after A's last renewal at most)
            async with lock.hold(7, wait="5s") as b:
                took = time.monotonic() - stopped
                assert took < 1.4
                assert b.fence > int(held["fence"])
                await asyncio.sleep(1.5 - took)
                a.signal(signal.SIGCONT)  # A wakes up after 1.5 s
                lost = await a.event("lost")
                assert lost["lost_set"] is True
                renew = await a.event("renew")
                assert renew["code"] == "lost"  # its renewal after expiry is refused
                release = await a.event("release")
                assert release["released"] is False  # its release changes nothing
                await a.event("done")
                assert holders(await store.status(), "summaries", "7") == (1, 0)
                async with third.lock("summaries", ttl="1s").try_hold("7") as theirs:
                    assert theirs is None
                assert not b.lost.is_set()
            # B's own release worked (no LostError came out of its block) and the key is free
            async with third.lock("summaries", ttl="1s").try_hold("7") as theirs:
                assert theirs is not None


# contract: LOCK-03
async def test_waits_give_up_after_the_time_asked(tmp_path: Path) -> None:
    """X holds a key for 30 s; Y's hold(wait=0.5), hold(wait=0) and hold(wait=2) each give up after the time
    asked, with InUseError."""
    async with open_store("sidecar", tmp_path / "store") as store, other_client(store) as y_store:
        x = store.lock("summaries", ttl="30s")
        y = y_store.lock("summaries", ttl="30s")
        async with x.hold("chat-7"):
            for wait, low, high in ((0.5, 0.45, 1.0), (0, 0.0, 0.25), (2, 1.95, 2.6)):
                t0 = time.monotonic()
                said = f"held for all of the {wait}s wait" if wait else "held (no wait)"
                with pytest.raises(InUseError, match=re.escape(f'lock summaries: key "chat-7": {said}')):
                    async with y.hold("chat-7", wait=wait):
                        pass
                took = time.monotonic() - t0
                assert low <= took < high, (wait, took)


# contract: LOCK-03, LOCK-05
async def test_a_waiter_gets_the_key_as_soon_as_a_short_lease_runs_out_with_a_full_fresh_ttl(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    async with open_store("sidecar", directory) as store:
        y = store.lock("summaries", ttl="3s")
        async with actor(mode="freeze", dir=str(directory), lock="summaries", key="chat-7", ttl="1s") as x:
            await x.event("held")
            x.signal(signal.SIGSTOP)  # X can no longer renew: its lease runs out within 1 s
            stopped = time.monotonic()
            async with y.hold("chat-7", wait="5s") as lease:
                got = time.monotonic()
                now = datetime.now(UTC)
                assert got - stopped < 1.3  # as soon as X's lease ran out, not at the end of Y's wait
                # a full ttl from the moment it was given, not what was left of X's
                assert timedelta(seconds=2.7) < lease.expires_at - now <= timedelta(seconds=3.1)
            x.signal(signal.SIGCONT)
            await x.event("lost")


# contract: LOCK-05
async def test_the_seeds_fenced_write_refuses_a_holder_that_froze(tmp_path: Path) -> None:
    """A holder that froze past its ttl (SIGSTOP, in the middle of its work) writes with its old fence after a
    newer holder wrote: the seed's ``where summary_fence < ?`` update changes nothing."""
    directory = tmp_path / "store"
    async with open_store("sidecar", directory) as store:
        db = await store.database("app", migrations=MIGRATIONS)
        summaries = store.lock("summaries", ttl="1s")
        cfg = {"dir": str(directory), "lock": "summaries", "key": "7", "ttl": "1s", "db": "app", "chat": 7}
        async with actor(mode="fenced", summary="from A (stale)", **cfg) as a:
            a_fence = (await a.event("held"))["fence"]
            a.signal(signal.SIGSTOP)  # frozen in the middle of its work, holding the key
            async with summaries.hold(7, wait="5s") as lease:
                b_fence = f"{lease.fence:040d}"
                assert b_fence > a_fence  # as text too: 40 digits sort as the numbers do
                done = await db.exec(
                    "update chats set summary = ?, summary_fence = ? where id = ? and summary_fence < ?",
                    "from B",
                    b_fence,
                    7,
                    b_fence,
                )
                assert done.changes == 1
            writes = (await store.status())["databases"]["app"]["writes"]
            a.signal(signal.SIGCONT)
            a.send("go")  # A's work ends: it writes with its old fence at once, then hears it lost the lease
            await a.event("done")
            # A's write came, or A heard it lost the lease first and its write was cancelled before it was sent
            # (a lost lease ends the block at once: the release is not awaited)
            assert (await store.status())["databases"]["app"]["writes"] in (writes, writes + 1)
            # A either heard it lost the lease before the write's answer came, or saw its write change nothing
            assert a.named("lost") or a.named("wrote") == [{"event": "wrote", "changes": 0}], a.events
        row = await db.one("select summary, summary_fence from chats where id = 7")
        assert row == {"summary": "from B", "summary_fence": b_fence}


# ---------------------------------------------------------------- the seed's snippet, as written


class Model:
    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, messages: list[str]) -> str:
        self.calls += 1
        await asyncio.sleep(0.01)
        return f"{len(messages)} messages, summary {self.calls}"


# contract: LOCK-01
async def test_the_seeds_summary_snippet_runs_as_written(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=MIGRATIONS)
    summaries = store.lock("summaries", ttl="30s")
    model = Model()

    async def history(chat_id: int) -> list[str]:
        return ["hi", "hello", "how are you"]

    async def summarize_chat(chat_id: int) -> None:
        async with summaries.try_hold(chat_id) as lease:
            if lease is None:
                return  # another worker is writing this chat's summary
            summary = await model.summarize(await history(chat_id))
            fence = f"{lease.fence:040d}"
            await db.exec(
                "update chats set summary = ?, summary_fence = ? where id = ? and summary_fence < ?",
                summary,
                fence,
                chat_id,
                fence,
            )

    # two replies finish at once: one summary runs
    await asyncio.gather(summarize_chat(7), summarize_chat(7))
    assert model.calls == 1
    first = await db.one("select summary, summary_fence from chats where id = 7")
    assert first is not None and first["summary"] == "3 messages, summary 1"
    assert len(first["summary_fence"]) == 40 and int(first["summary_fence"]) >> 64 > 0
    # a later summary (a larger fence) overwrites it
    await summarize_chat(7)
    second = await db.one("select summary, summary_fence from chats where id = 7")
    assert second is not None and second["summary"] == "3 messages, summary 2"
    assert second["summary_fence"] > first["summary_fence"]
