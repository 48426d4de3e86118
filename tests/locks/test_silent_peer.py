"""A client the network cut off without a close (no FIN, no RST: a partition, a proxy that stopped passing bytes)
is dropped by the server once it sent nothing for ``PEER_SILENCE``, with its place in a lock's line and its
subscriptions; a live client that only waits (in a line, for pushes) sends a ping before that. From trial BN: such
a waiter stayed in the line for ever, was given the key for its whole ttl, and a live client's hold failed
"held for all of the wait"; its subscriptions counted against the limit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.protocol.frames import Kind
from tinystore.protocol.locks import ACQUIRE_MANY, Acquire, AcquireMany, AcquireOutcome
from tinystore.protocol.messages import decode, encode
from tinystore.server import listener, paths

from ..store.raw import RawClient


async def _owner_holds(owner: tinystore.Store) -> tuple[asyncio.Future[None], asyncio.Event]:
    """The store's own process holds key ``k`` of lock ``l`` until the event returned is set."""
    release, holding = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with owner.lock("l", ttl="30s").hold("k"):
            holding.set()
            await release.wait()

    holder = asyncio.ensure_future(hold())
    await holding.wait()
    return holder, release


# contract: LOCK-03
# contract: CHAN-08
async def test_a_peer_silent_past_peer_silence_leaves_the_line_and_a_live_waiter_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener, "PEER_SILENCE", 1.0, raising=False)
    d = tmp_path / "s"
    owner = await tinystore.open(d, embedded=True)
    live = await tinystore.open(d)
    raw = await RawClient.open(("unix", paths.socket_path(d)))
    try:
        transport: Any = live.transport
        transport.keepalive_idle = 0.25  # (the SDK's 15 s, scaled as PEER_SILENCE is)
        heard: list[Any] = []
        sub = await live.channel("c").under("x").subscribe(heard.append, on_missed=heard.append)
        holder, release = await _owner_holds(owner)
        assert (await raw.hello()).kind is Kind.WELCOME
        ask = AcquireMany(items=[Acquire(lock="l", key="k", ttl_ms=20_000, wait_ms=30_000)], tickets=[1])
        got = await raw.call(5, ACQUIRE_MANY, encode(ask))
        assert decode(got.body, list[AcquireOutcome])[0].queued  # in line; then it says nothing more
        got_it: list[float] = []

        async def wait_live() -> None:
            async with live.lock("l", ttl="30s").hold("k", wait="10s"):
                got_it.append(asyncio.get_running_loop().time())

        live_waiter = asyncio.ensure_future(wait_live())
        await asyncio.sleep(2.5)  # past PEER_SILENCE: the raw peer is dropped, the live ones ping
        status = await owner.status()
        remote = [c for c in status["connections"] if not c["local"]]
        assert len(remote) == 1, status["connections"]  # the live client's only
        release.set()
        await holder
        await asyncio.wait_for(live_waiter, 5)  # the key went to the live waiter, not the silent one
        assert got_it
        assert heard == [] and sub.reconnects == 0  # the live subscriber was never dropped
        await sub.stop()
    finally:
        await raw.close()
        await live.close()
        await owner.close()


# contract: LOCK-03
# contract: LOCK-07
async def test_a_reconnected_clients_connection_before_ends_with_its_place_in_line(tmp_path: Path) -> None:
    # from trial BR: the network cut the client's connection on its side only; it reconnected and asked again, but
    # its ask on the old connection, still in line at the server, got the key for the lease's whole ttl
    import os

    d = tmp_path / "s"
    owner = await tinystore.open(d, embedded=True)
    client = await tinystore.open(d)
    kept: int | None = None
    try:
        holder, release = await _owner_holds(owner)
        got: list[float] = []

        async def wait_client() -> None:
            async with client.lock("l", ttl="20s").hold("k", wait="20s"):
                got.append(asyncio.get_running_loop().time())

        waiter = asyncio.ensure_future(wait_client())
        await asyncio.sleep(0.3)  # in line
        transport: Any = client.transport
        sock = transport._conn.transport.get_extra_info("socket")
        kept = os.dup(sock.fileno())  # the server's side stays open: it hears of no close
        transport.abort()
        await asyncio.sleep(1.0)  # the SDK reconnects and asks again
        release.set()
        await holder
        await asyncio.wait_for(waiter, 5)  # not a ttl (20 s) later
        assert got
    finally:
        if kept is not None:
            os.close(kept)
        await client.close()
        await owner.close()


# contract: LOCK-03
async def test_a_server_that_did_not_run_does_not_count_that_time_as_its_peers_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trial GO: a server frozen (SIGSTOP) for 75 s dropped its connections as it woke, "sent nothing for 75s": the
    # time it did not run was counted as its clients' silence, what they sent meanwhile unread
    import time

    monkeypatch.setattr(listener, "PEER_SILENCE", 1.0, raising=False)
    d = tmp_path / "s"
    owner = await tinystore.open(d, embedded=True)
    raw = await RawClient.open(("unix", paths.socket_path(d)))
    try:

        async def remote() -> int:
            return len([c for c in (await owner.status())["connections"] if not c["local"]])

        assert (await raw.hello()).kind is Kind.WELCOME
        assert await remote() == 1
        time.sleep(2.0)  # noqa: ASYNC251 (this process, the server, does not run: past PEER_SILENCE)
        await asyncio.sleep(0.05)
        assert await remote() == 1  # not dropped as it woke
        await asyncio.sleep(2.0)  # silent for PEER_SILENCE while the server ran: dropped
        assert await remote() == 0
    finally:
        await raw.close()
        await owner.close()
