"""A connection that stops reading costs the store at most its buffer, whatever its credit and however many
subscriptions it has (CHAN-08), and still learns exactly what it missed once it reads again (CHAN-02).

Raw clients over the embedded store's socket: the SDK never asks for more than the prefetch window, and never
stops reading its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.protocol import frames
from tinystore.protocol.channels import DELIVER, GRANT, Delivery, Grant, MessageItem, MissedItem, Subscribe, Subscribed
from tinystore.protocol.frames import Frame, Kind
from tinystore.protocol.messages import decode, encode
from tinystore.server import paths
from tinystore.server.listener import HIGH_WATER, LOW_WATER

from ..helpers import open_store
from ..store.raw import RawClient
from ..store.test_cancel import server_side, wait_for

PREFETCH = tinystore.Limits().channel_prefetch
# what a connection that does not read may hold on the server: the transport's high-water mark, the megabyte of
# pushes that goes to the transport at once, and one push past the mark (a credit's worth of the largest messages)
BOUND = HIGH_WATER + LOW_WATER + PREFETCH * (64 * 1024 + 256)


def buffered(conn: Any) -> int:
    """Bytes the server holds for connection ``conn``: its transport's buffer and what waits to go to it."""
    return int(conn.transport.get_write_buffer_size()) + sum(map(len, conn.out))


class Reader:
    """Subscriptions of one raw connection: reads every push, checks each subscription's messages against the
    published ids (a missed notice of n skips exactly n), and grants back the credit of what it received."""

    def __init__(self, raw: RawClient, *, grant: bool = True) -> None:
        self.raw = raw
        self.grant = grant
        self.streams = itertools.count(100_000)
        self.seen: dict[int, int] = {}  # sub → index in ids of the next message it should get
        self.missed: dict[int, list[int]] = {}
        self.outstanding: dict[int, int] = {}  # sub → messages received and not granted back yet
        self.ids: list[str] = []
        self.errors: list[str] = []
        self.task: asyncio.Task[None] | None = None

    async def subscribe(self, count: int, credit: int | None) -> None:
        first = next(self.streams)
        for i in range(count):
            body = encode(Subscribe(channel="big", branch=["x"], credit=credit))
            self.raw.send(frames.request_frame(first + i, "channels.subscribe", body))
        for _ in range(count):
            f = await self.raw.frame(timeout=20)
            assert isinstance(f, Frame) and f.kind is Kind.RESPONSE, f
            sub = decode(f.body, Subscribed).sub
            self.seen[sub] = 0
            self.missed[sub] = []
            self.outstanding[sub] = 0

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        while True:
            f = await self.raw.frame(timeout=60)
            assert isinstance(f, Frame), "the server closed the connection"
            if f.kind is Kind.PUSH and f.method == DELIVER:
                self.receive(decode(f.body, Delivery))

    def receive(self, d: Delivery) -> None:
        got = 0
        for item in d.items:
            if isinstance(item, MissedItem):
                assert item.count is not None
                self.missed[d.sub].append(item.count)
                self.seen[d.sub] += item.count
            else:
                assert isinstance(item, MessageItem)
                i = self.seen[d.sub]
                if i >= len(self.ids) or item.id != self.ids[i]:
                    self.errors.append(f"sub {d.sub}: got {item.id} where {self.ids[i : i + 1]} was due")
                self.seen[d.sub] = i + 1
                got += 1
        self.outstanding[d.sub] += got
        if self.outstanding[d.sub] > PREFETCH:
            self.errors.append(f"sub {d.sub}: {self.outstanding[d.sub]} messages sent past a credit of {PREFETCH}")
        if got and self.grant:
            self.raw.send(frames.request_frame(next(self.streams), GRANT, encode(Grant(d.sub, got))))
            self.outstanding[d.sub] -= got

    def done(self) -> bool:
        return all(n == len(self.ids) for n in self.seen.values())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@contextlib.asynccontextmanager
async def two_connections(
    tmp_path: Path, limits: tinystore.Limits | None = None
) -> AsyncIterator[tuple[tinystore.Store, RawClient, Any, RawClient]]:
    """An embedded store; a raw connection that will not read (and the server's side of it); a raw
    connection that reads."""
    async with open_store("embedded", tmp_path / "s", limits=limits) as store:
        where = ("unix", paths.socket_path(tmp_path / "s"))
        slow = await RawClient.open(where)
        good: RawClient | None = None
        try:
            assert (await slow.hello()).kind is Kind.WELCOME
            conn = server_side(store)
            good = await RawClient.open(where)
            assert (await good.hello()).kind is Kind.WELCOME
            yield store, slow, conn, good
        finally:
            await slow.close()
            if good is not None:
                await good.close()


async def publish_while_one_does_not_read(
    store: tinystore.Store, conn: Any, slow: Reader, good: Reader, count: int, size: int
) -> int:
    """Publish ``count`` messages of ``size`` bytes on big/x, each once the reading connection got the one
    before; returns the most bytes the server held for the connection that does not read."""
    ch = store.channel("big").under("x")
    most = 0
    for i in range(count):
        mid = await ch.publish(bytes([i % 256]) * size)
        slow.ids.append(mid)
        good.ids.append(mid)
        await wait_for(lambda: good.done() or bool(good.errors), "the reading subscriber to get the message")
        most = max(most, buffered(conn))
    for _ in range(5):  # deliveries of the last turns
        await asyncio.sleep(0.01)
        most = max(most, buffered(conn))
    return most


@pytest.mark.contract("CHAN-08")
async def test_a_huge_credit_on_a_connection_that_does_not_read_keeps_the_server_bounded(tmp_path: Path) -> None:
    # contract: CHAN-08
    async with two_connections(tmp_path) as (store, slow_raw, conn, good_raw):
        slow, good = Reader(slow_raw), Reader(good_raw)
        await slow.subscribe(1, credit=1_000_000_000)  # then it reads nothing
        await good.subscribe(1, credit=None)
        good.start()
        try:
            most = await publish_while_one_does_not_read(store, conn, slow, good, 600, 60_000)
            assert not good.errors, good.errors[:3]
            assert good.done() and not any(good.missed.values()), "the reading subscriber lost messages"
            assert most <= BOUND, f"the server held {most} bytes for a connection that does not read (bound {BOUND})"
            # it reads again: what it was sent, a missed notice of exactly what its log dropped, the rest
            slow.start()
            await wait_for(lambda: slow.done() or bool(slow.errors), "the slow subscriber to catch up", 60)
            assert not slow.errors, slow.errors[:3]
            (missed,) = slow.missed.values()
            assert sum(missed) > 0, "600 messages of 60 KB fit no branch log: some were dropped"
        finally:
            await slow.stop()
            await good.stop()


@pytest.mark.contract("CHAN-08")
@pytest.mark.contract("CHAN-02")
async def test_many_subscriptions_on_a_connection_that_does_not_read_keep_the_server_bounded(tmp_path: Path) -> None:
    # contract: CHAN-08
    # contract: CHAN-02
    async with two_connections(tmp_path, tinystore.Limits(channel_log=100)) as (store, slow_raw, conn, good_raw):
        slow, good = Reader(slow_raw), Reader(good_raw)
        await slow.subscribe(48, credit=None)  # the default credit each; then it reads nothing
        await good.subscribe(1, credit=None)
        good.start()
        try:
            most = await publish_while_one_does_not_read(store, conn, slow, good, 200, 16_000)
            assert not good.errors, good.errors[:3]
            assert good.done() and not any(good.missed.values()), "the reading subscriber lost messages"
            assert most <= BOUND, f"the server held {most} bytes for a connection that does not read (bound {BOUND})"
            slow.start()
            await wait_for(lambda: slow.done() or bool(slow.errors), "the slow subscribers to catch up", 60)
            assert not slow.errors, slow.errors[:3]
            # every subscription: delivered + missed == published, each message where its id says (Reader checks)
            assert all(sum(m) > 0 for m in slow.missed.values()), "a log of 100 held all 200 messages"
        finally:
            await slow.stop()
            await good.stop()


@pytest.mark.contract("CHAN-08")
async def test_a_credit_or_grant_past_the_prefetch_window_gives_the_window(tmp_path: Path) -> None:
    # contract: CHAN-08
    async with two_connections(tmp_path) as (store, _slow, _conn, raw):
        reader = Reader(raw, grant=False)
        await reader.subscribe(1, credit=1_000_000_000)
        (sub,) = reader.seen
        assert (await raw.call(1, GRANT, encode(Grant(sub, 1_000_000_000)))).kind is Kind.RESPONSE
        reader.start()
        try:
            ch = store.channel("big").under("x")
            for i in range(PREFETCH * 3):
                reader.ids.append(await ch.publish(i))
            await wait_for(lambda: reader.seen[sub] >= PREFETCH, "the first deliveries")
            await asyncio.sleep(0.2)
            assert reader.seen[sub] == PREFETCH, "sent past the prefetch window without a grant"
            assert not reader.errors, reader.errors[:3]
            # a grant within the window is taken whole
            raw.send(frames.request_frame(2, GRANT, encode(Grant(sub, 10))))
            await wait_for(lambda: reader.seen[sub] >= PREFETCH + 10, "the granted deliveries")
            await asyncio.sleep(0.2)
            assert reader.seen[sub] == PREFETCH + 10
        finally:
            await reader.stop()
