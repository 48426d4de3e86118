"""A graceful stop of the store ends every lease held through it at once (LOCK-07: after a restart nobody holds
anything), and a lost lease's block raises without waiting for the network.

From a tester's report: with ``tinystore serve`` stopped by SIGTERM and started again, a waiter entered its block
before the holder's block was cancelled (2 runs of 3): the holder's SDK learnt of the restart only when its own
connection reconnected, and the waiter's connection reconnected first. And on a silent network, ``LostError`` left
the ``async with`` 0.5 to 1 s after the block was cancelled: its ``__aexit__`` waited for the release on the dead
connection, so ``except LostError:`` code ran after the next holder had started.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import LostError
from tinystore.server import paths

from ..helpers import ServerProcess, free_port, gone, open_store, stop_sidecar, write_tokens
from .support import other_client

HOLDER_RECONNECT_DELAY = 4.0
"""Seconds the holder's SDK takes for each attempt to reconnect (a slow network on its side): its reconnect comes
well after the waiter's, so only a notice before the reconnect can end its block in time."""


def fresh(coro: Any) -> asyncio.Task[Any]:
    """A task that does not inherit this one's held keys."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


def slow_reconnects(store: tinystore.Store) -> None:
    """Make every (re)connection of ``store`` wait :data:`HOLDER_RECONNECT_DELAY` first."""
    transport: Any = store.transport
    endpoint: Callable[[], Awaitable[Any]] = transport.endpoint

    async def slow() -> Any:
        await asyncio.sleep(HOLDER_RECONNECT_DELAY)
        return await endpoint()

    transport.endpoint = slow


class Timeline:
    """What happened, in order, with the loop's time."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def __call__(self, what: str) -> None:
        self.events.append((what, asyncio.get_running_loop().time()))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def at(self, what: str) -> float:
        return next(t for name, t in self.events if name == what)


async def hold_until_lost(store: tinystore.Store, timeline: Timeline, held: asyncio.Event, cleanup: float = 0) -> str:
    """Hold key "k" of lock "l" until the lease is lost; its block takes ``cleanup`` seconds to end once cancelled.
    Returns the LostError's message."""
    try:
        async with store.lock("l", ttl="10s").hold("k"):
            held.set()
            try:
                await asyncio.sleep(60)
            finally:
                if cleanup:
                    await asyncio.shield(asyncio.sleep(cleanup))
                timeline("holder's block ended")
    except LostError as exc:
        timeline("holder got LostError")
        return exc.message
    raise AssertionError("the holder's block was not cancelled")


async def wait_for_key(store: tinystore.Store, timeline: Timeline) -> None:
    """Wait in line for key "k" of lock "l" and note when the block starts (its lease may be lost later, when its
    own server stops)."""
    try:
        async with store.lock("l", ttl="10s").hold("k", wait="30s"):
            timeline("waiter's block started")
            await asyncio.sleep(0.2)
    except LostError:
        pass


async def until_waiting(store: tinystore.Store) -> None:
    deadline = time.monotonic() + 10
    while True:
        keys = (await store.status())["locks"]["keys"]
        if any(row["key"] == "k" and row["waiters"] for row in keys):
            return
        assert time.monotonic() < deadline, keys
        await asyncio.sleep(0.02)


# contract: LOCK-07
@pytest.mark.parametrize("mode", ["tcp", "sidecar", "private"])
async def test_a_graceful_stop_ends_the_holders_block_before_a_waiter_enters_on_the_next_server(
    mode: str, tmp_path: Path
) -> None:
    directory = tmp_path / "store"
    servers: list[ServerProcess] = []
    args: list[str] = []
    if mode == "tcp":
        tokens, admin, _ = write_tokens(tmp_path)
        addr = f"tcp://127.0.0.1:{free_port()}"
        args = ["--listen", addr, "--tokens", str(tokens)]
        servers.append(ServerProcess(directory, *args).start())
        holder = await tinystore.connect(addr, token=admin)
        waiter = await tinystore.connect(addr, token=admin)
    else:
        holder = await (tinystore.open(directory, private=True) if mode == "private" else tinystore.open(directory))
        waiter = await tinystore.open(directory)  # the holder's server (a private one or the sidecar)
    timeline = Timeline()
    try:
        slow_reconnects(holder)
        held = asyncio.Event()
        holding = fresh(hold_until_lost(holder, timeline, held))
        await held.wait()
        waiting = fresh(wait_for_key(waiter, timeline))
        await until_waiting(waiter)
        pid = int((paths.read_address(directory) or {})["pid"])
        os.kill(pid, signal.SIGTERM)  # a graceful stop; the holder's process stays alive, its network too
        if mode == "tcp":
            proc = servers[0].proc
            assert proc is not None
            while proc.poll() is None:  # (our child: reaped here)
                await asyncio.sleep(0.02)
            servers.append(ServerProcess(directory, *args).start())
        else:
            assert await gone(pid)
        if mode == "private":  # (a private server stopped on purpose is not started again by its store)
            servers.append(ServerProcess(directory).start())
        # (sidecar: the waiter's SDK starts one again)
        message = await asyncio.wait_for(holding, 30)
        await asyncio.wait_for(waiting, 30)
        assert timeline.names() == ["holder's block ended", "holder got LostError", "waiter's block started"], (
            timeline.events
        )
        assert "the store is stopping" in message, message
    finally:
        await asyncio.wait_for(waiter.close(), 15)
        await asyncio.wait_for(holder.close(), 15)
        for server in servers:
            server.stop()
        await stop_sidecar(directory)


# contract: LOCK-04
@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
async def test_closing_the_store_lets_a_key_go_only_once_the_holders_block_has_ended(mode: str, tmp_path: Path) -> None:
    """The store closed under a block: the block is cancelled, and its key goes to the next in line (another
    process's waiter, over the socket) only once the block has ended, its cleanup after the cancel too; from the
    next server, when the store closed was an embedded one (a store that is stopping gives no lease: trial DT)."""
    timeline = Timeline()
    async with open_store(mode, tmp_path / "store") as store:
        async with other_client(store) as other:
            mine = store if mode == "embedded" else await tinystore.open(tmp_path / "store")
            held = asyncio.Event()
            holding = fresh(hold_until_lost(mine, timeline, held, cleanup=0.5))
            await held.wait()
            waiting = fresh(wait_for_key(other, timeline))
            await until_waiting(other)
            await mine.close()
            message = await asyncio.wait_for(holding, 10)
            if mode == "embedded":
                # (a store that is stopping gives no lease, trial DT: the waiter gets it from the next server)
                mine = await tinystore.open(tmp_path / "store", embedded=True)
            try:
                await asyncio.wait_for(waiting, 30)
            finally:
                if mode == "embedded":
                    await mine.close()
            assert "the store was closed" in message, message
            assert timeline.names() == ["holder's block ended", "holder got LostError", "waiter's block started"], (
                timeline.events
            )


# contract: LOCK-05
async def test_lost_error_leaves_the_block_at_once_when_the_store_does_not_answer(tmp_path: Path) -> None:
    """The store stopped answering (SIGSTOP: a silent network): the SDK declares the lease lost, cancels the block,
    and LostError comes out of the ``async with`` at once; the release waits in the background (the store's close
    waits for it, a few seconds at most)."""
    server = ServerProcess(tmp_path / "store").start()
    assert server.proc is not None
    try:
        store = await tinystore.open(tmp_path / "store")
        timeline = Timeline()
        try:
            with pytest.raises(LostError, match="no renewal succeeded for"):
                async with store.lock("l", ttl="3s").hold("k"):
                    server.proc.send_signal(signal.SIGSTOP)
                    try:
                        await asyncio.sleep(30)
                    finally:
                        timeline("block cancelled")
            timeline("LostError")
            assert timeline.at("LostError") - timeline.at("block cancelled") < 0.2, timeline.events
        finally:
            server.proc.send_signal(signal.SIGCONT)
            await asyncio.wait_for(store.close(), 15)
    finally:
        server.stop()
