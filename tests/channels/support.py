"""Helpers for the channel tests: a recorder of what a subscription hears, polling, pacing, second connections."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import tinystore

from ..helpers import drop_connection


class Heard:
    """Records what one subscription hears, in order: ``Message`` and ``Missed`` objects in ``events``."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.values: list[Any] = []
        self.messages: list[tinystore.Message[Any]] = []
        self.missed = 0
        self.unknown = 0  # missed notices whose count is None
        self.notices: list[tinystore.Missed] = []

    def on_message(self, m: tinystore.Message[Any]) -> None:
        self.events.append(m)
        self.messages.append(m)
        self.values.append(m.value)

    def on_missed(self, x: tinystore.Missed) -> None:
        self.events.append(x)
        self.notices.append(x)
        if x.count is None:
            self.unknown += 1
        else:
            self.missed += x.count

    @property
    def count(self) -> int:
        """Messages heard plus messages told missed."""
        return len(self.values) + self.missed

    def shape(self) -> list[Any]:
        """Events as ``("m", value)`` and ``("missed", reason, count)`` tuples, for exact comparisons."""
        return [
            ("missed", e.reason, e.count) if isinstance(e, tinystore.Missed) else ("m", e.value) for e in self.events
        ]


async def eventually(pred: Callable[[], bool], timeout: float = 20.0, what: str = "the condition") -> None:
    """Poll ``pred`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g}s")
        await asyncio.sleep(0.005)


async def publish_all(ch: tinystore.Channel[Any], values: Iterable[Any], chunk: int = 256) -> None:
    """Publish ``values`` in order, ``chunk`` in flight at a time (publishes back to back)."""
    batch: list[Any] = []
    for v in values:
        batch.append(v)
        if len(batch) == chunk:
            await asyncio.gather(*(ch.publish(x) for x in batch))
            batch = []
    if batch:
        await asyncio.gather(*(ch.publish(x) for x in batch))


async def publish_paced(
    ch: tinystore.Channel[Any],
    values: list[Any],
    progress: Callable[[], int],
    *,
    window: int = 512,
    chunk: int = 128,
) -> None:
    """Publish ``values`` in chunks, never more than ``window`` ahead of ``progress()`` (what the slowest
    subscriber handled): a subscriber that keeps up, whatever the machine's speed."""
    for i in range(0, len(values), chunk):
        await asyncio.gather(*(ch.publish(x) for x in values[i : i + chunk]))
        published = i + chunk
        if published - progress() > window:
            await eventually(lambda p=published: p - progress() <= window, what="the subscriber keeping up")  # type: ignore[misc]


@contextlib.asynccontextmanager
async def second_store(store: tinystore.Store) -> AsyncIterator[tinystore.Store]:
    """Another connection to the same server as ``store`` (any mode: an embedded store serves its socket)."""
    if store.mode == "remote":
        t: Any = store.transport
        other = await tinystore.connect(t.description, token=t.token)
    else:
        assert store.directory is not None
        other = await tinystore.open(store.directory, idle="5s")
    try:
        yield other
    finally:
        await other.close()


async def drop(store: tinystore.Store) -> None:
    """Cut the store's connection (as a network fault would) and wait until the SDK noticed: a publish made
    before that may be written on the dying connection and end in ``OutcomeUnknownError``, as it should."""
    t: Any = store.transport
    old = t._conn
    drop_connection(store)
    await eventually(lambda: t._conn is not old, what="the SDK to notice the drop")


async def subscriptions(store: tinystore.Store) -> int:
    """How many subscriptions the store holds (all clients)."""
    st = await store.status()
    return int(st["channels"]["subscriptions"])


@contextlib.asynccontextmanager
async def cli_subscriber(store: tinystore.Store, target: str) -> AsyncIterator[subprocess.Popen[str]]:
    """``tinystore channels DIR subscribe TARGET --for 20s`` on ``store``'s directory (an embedded store that
    serves its socket), once the store has its subscription; terminated at the end."""
    listener = subprocess.Popen(
        [sys.executable, "-m", "tinystore", "channels", str(store.directory), "subscribe", target, "--for", "20s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while await subscriptions(store) < 1:
            assert asyncio.get_running_loop().time() < deadline, "the CLI did not subscribe"
            assert listener.poll() is None, listener.stderr.read() if listener.stderr else ""
            await asyncio.sleep(0.05)
        yield listener
    finally:
        listener.terminate()
        await asyncio.to_thread(listener.wait, 20)
