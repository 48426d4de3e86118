"""A bounded soak of channels: many publishers, fast, slow, stalled and reconnecting subscribers.

Checks, for every subscription, that messages handled + missed counts == messages published to its branches
(CHAN-02, across reconnects: CHAN-04), that each branch's messages arrive in order without duplicates, that the
store's held bytes never pass its bound (CHAN-08), and that no subscription buffers more than its prefetch.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

import tinystore
from tinystore import Limits, Message, Missed

from ..helpers import drop_connection, open_store
from .support import eventually, second_store

BRANCHES = 8
PUBLISHERS = 8
DURATION = 5.0  # seconds of publishing
LIMITS = Limits(channel_log=200, channel_log_bytes=96 * 1024, channel_total_bytes=512 * 1024)


class Event(msgspec.Struct, array_like=True):
    publisher: int
    n: int
    pad: str


class Tally:
    """What one subscription heard: per branch the seqs (checked in order), and the missed counts."""

    def __init__(self, name: str, branches: list[int], *, delay: float = 0.0, stall_at: int = -1) -> None:
        self.name = name
        self.branches = branches
        self.delay = delay
        self.stall_at = stall_at
        self.handled = 0
        self.missed = 0
        self.unknown = 0
        self.last_seq: dict[tuple[str, ...], int] = {}
        self.errors: list[str] = []
        self.notices: list[Missed] = []

    async def on_message(self, m: Message[Event]) -> None:
        key = tuple(m.branch)
        last = self.last_seq.get(key, 0)
        if m.seq <= last:
            self.errors.append(f"{self.name}: seq {m.seq} after {last} on {key}")
        self.last_seq[key] = m.seq
        self.handled += 1
        if self.handled == self.stall_at:
            await asyncio.sleep(2.0)  # a frozen tab
        elif self.delay:
            await asyncio.sleep(self.delay)

    def on_missed(self, x: Missed) -> None:
        self.notices.append(x)
        if x.count is None:
            self.unknown += 1
        else:
            self.missed += x.count

    def total(self) -> int:
        return self.handled + self.missed


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_soak_counts_stay_exact_and_memory_bounded(mode: str, tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        main = await stack.enter_async_context(open_store(mode, tmp_path / "store", limits=LIMITS))
        pub2 = await stack.enter_async_context(second_store(main))
        steady = await stack.enter_async_context(second_store(main))
        flaky = await stack.enter_async_context(second_store(main))

        tallies: list[Tally] = []
        subs: list[tinystore.Subscription[Event]] = []

        async def subscribe(store: tinystore.Store, tally: Tally, *, recursive: bool = False) -> None:
            ch = store.channel("soak", Event)
            if not recursive:
                ch = ch.under(tally.branches[0])
            subs.append(await ch.subscribe(tally.on_message, on_missed=tally.on_missed, recursive=recursive))
            tallies.append(tally)

        for b in range(BRANCHES):
            await subscribe(steady, Tally(f"fast-{b}", [b]))
            await subscribe(steady, Tally(f"slow-{b}", [b], delay=0.002))
            await subscribe(flaky, Tally(f"flaky-fast-{b}", [b]))
            await subscribe(flaky, Tally(f"flaky-slow-{b}", [b], delay=0.001))
        await subscribe(steady, Tally("stalled-0", [0], stall_at=50))
        await subscribe(main, Tally("recursive", list(range(BRANCHES))), recursive=True)

        # each() loops on the steady connection, one per branch pair
        each_tallies = [Tally(f"each-{b}", [b]) for b in range(0, BRANCHES, 2)]

        async def each_loop(t: Tally) -> None:
            async with contextlib.aclosing(
                steady.channel("soak", Event).under(t.branches[0]).each(on_missed=t.on_missed)
            ) as it:
                async for m in it:
                    await t.on_message(m)

        tasks = [asyncio.ensure_future(each_loop(t)) for t in each_tallies]
        tallies += each_tallies
        expected_subs = len(subs) + len(each_tallies)
        deadline = time.monotonic() + 10
        while (await main.status())["channels"]["subscriptions"] < expected_subs:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

        published = [0] * BRANCHES
        stop_at = time.monotonic() + DURATION
        rng = random.Random(7)

        async def publisher(i: int) -> None:
            store = main if i % 2 else pub2
            ch = store.channel("soak", Event)
            n = 0
            while time.monotonic() < stop_at:
                batch = []
                for _ in range(16):
                    b = rng.randrange(BRANCHES)
                    n += 1
                    batch.append((b, Event(i, n, "x" * rng.randrange(50, 1500))))
                await asyncio.gather(*(ch.under(b).publish(e) for b, e in batch))
                for b, _ in batch:
                    published[b] += 1
                await asyncio.sleep(0)

        peak = {"bytes": 0, "buffered": 0}
        done = asyncio.Event()

        async def sampler() -> None:
            while not done.is_set():
                st = (await main.status())["channels"]
                assert st["bytes"] <= LIMITS.channel_total_bytes, st
                assert st["messages"] <= LIMITS.channel_log * BRANCHES, st
                peak["bytes"] = max(peak["bytes"], st["bytes"])
                for s in subs:
                    buffered = s.statistics()["buffered"]
                    assert buffered <= LIMITS.channel_prefetch, (s, buffered)
                    peak["buffered"] = max(peak["buffered"], buffered)
                await asyncio.sleep(0.05)

        drops = 0

        async def dropper() -> None:
            nonlocal drops
            while time.monotonic() < stop_at:
                await asyncio.sleep(0.6)
                drop_connection(flaky)
                drops += 1

        sampling = asyncio.ensure_future(sampler())
        started = time.perf_counter()
        await asyncio.gather(*(publisher(i) for i in range(PUBLISHERS)), dropper())
        took = time.perf_counter() - started
        total = sum(published)

        def expected(t: Tally) -> int:
            return sum(published[b] for b in t.branches)

        try:
            await eventually(lambda: all(t.total() >= expected(t) for t in tallies), timeout=30)
        finally:
            done.set()
            await sampling
            report = {t.name: (t.handled, t.missed, expected(t), t.unknown) for t in tallies}
            print(f"\n{mode}: published {total} in {took:.1f}s, {drops} drops, peak {peak}; {report}")
        for t in tallies:
            assert t.errors == [], t.errors
            assert t.unknown == 0, (t.name, t.notices)
            assert t.total() == expected(t), (t.name, t.handled, t.missed, expected(t))
        assert drops >= 5
        assert any(t.missed for t in tallies)  # slow ones fell behind and were told
        for t in tallies:
            if t.name.startswith("flaky"):
                assert any(x.reason == "reconnect" for x in t.notices), t.name
        for s in subs:
            await s.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        st: Any = (await main.status())["channels"]
        assert st["subscriptions"] == 0
