"""From trial AX: a `hold(wait=...)` waiting in line when its server restarted was failed only at a reconnect;
with its token revoked across the restart there was none, and it waited for ever (past its wait and the
reconnect timeout). A dropped connection ends the wait in line at once: the waiter asks again, which waits for
the next connection as any call does (failed at once by a refused token)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import tinystore

from ..helpers import ServerProcess, free_port


async def held_by(store: tinystore.Store) -> asyncio.Future[None]:
    """A task holding key "report" of lock "nightly" until cancelled (or its lease is lost), once it holds it."""
    held = asyncio.Event()

    async def hold() -> None:
        try:
            async with store.lock("nightly", ttl="5s").hold("report"):
                held.set()
                await asyncio.sleep(3600)
        except tinystore.TinystoreError:
            pass

    task = asyncio.ensure_future(hold())
    await held.wait()
    return task


async def in_line(store: tinystore.Store, wait: str) -> str:
    """Wait in line for that key: "held", or the name of the error it ended with."""
    try:
        async with store.lock("nightly", ttl="5s").hold("report", wait=wait):
            return "held"
    except tinystore.TinystoreError as exc:
        return type(exc).__name__


# contract: LOCK-03
# contract: STORE-06
@pytest.mark.parametrize("revoke", [True, False])
async def test_a_waiter_in_line_when_the_server_restarts_is_answered(tmp_path: Path, revoke: bool) -> None:
    holder_t, waiter_t = "holder-" + "a" * 20, "waiter-" + "b" * 20
    tokens = tmp_path / "tokens"
    tokens.write_text(f"data {holder_t}\ndata {waiter_t}\n")
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = ServerProcess(tmp_path / "store", "--listen", addr, "--tokens", str(tokens)).start()
    try:
        holder = await tinystore.connect(addr, token=holder_t)
        waiter = await tinystore.connect(addr, token=waiter_t, reconnect_timeout=10)
        try:
            holding = await held_by(holder)
            waiting = asyncio.ensure_future(in_line(waiter, "5s"))
            await asyncio.sleep(0.5)  # in line now
            if revoke:
                tokens.write_text(f"data {holder_t}\n")
            started = time.monotonic()
            server.stop()
            server.start()
            got = await asyncio.wait_for(waiting, 30)
            # revoked: refused at once; kept: the restarted store holds nothing, and the key is the waiter's
            assert got == ("UnauthenticatedError" if revoke else "held"), got
            assert time.monotonic() - started < 15
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
        finally:
            await asyncio.wait_for(waiter.close(), 10)
            await asyncio.wait_for(holder.close(), 10)
    finally:
        server.stop()


# contract: LOCK-03
async def test_a_waiter_whose_store_is_gone_gives_up_at_the_end_of_its_wait(tmp_path: Path) -> None:
    """From trial AY: a waiter in line whose connection dropped asked again, waiting for the next connection up
    to reconnect_timeout (30 s), past its own wait of 1 s. It gives up when its wait ends. From trial AZ: a try
    (wait 0) while the SDK reconnects is asked of the store once it is reached, not refused as held."""
    tokens = tmp_path / "tokens"
    tokens.write_text("data " + "c" * 24 + "\n")
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = ServerProcess(tmp_path / "store", "--listen", addr, "--tokens", str(tokens)).start()
    try:
        holder = await tinystore.connect(addr, token="c" * 24)
        waiter = await tinystore.connect(addr, token="c" * 24, reconnect_timeout=30)
        try:
            holding = await held_by(holder)
            started = time.monotonic()
            waiting = asyncio.ensure_future(in_line(waiter, "2s"))
            await asyncio.sleep(0.3)  # in line now
            server.kill()  # gone, and not back within the wait
            got = await asyncio.wait_for(waiting, 30)
            # not InUseError: nobody may hold the key; the store could not be asked (trial AZ)
            assert got == "UnavailableError" and time.monotonic() - started < 5, (got, time.monotonic() - started)
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
            server.start()  # back: the holder's lease went with the old server
            trying = asyncio.ensure_future(in_line(waiter, "0s"))  # while the SDK reconnects
            assert await asyncio.wait_for(trying, 30) == "held"
        finally:
            await asyncio.wait_for(waiter.close(), 10)
            await asyncio.wait_for(holder.close(), 10)
    finally:
        server.stop()


# contract: LOCK-03
async def test_a_wait_asked_as_the_server_exits_ends_with_the_wait(tmp_path: Path) -> None:
    """From trial DH: asked right after the server exited, before the SDK noticed its connection had dropped,
    a hold with a wait of 2 s was sent as over a live connection, waited for the next one, and failed only after
    the reconnect_timeout (30 s). It fails as its wait ends."""
    tokens = tmp_path / "tokens"
    tokens.write_text("data " + "c" * 24 + "\n")
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = ServerProcess(tmp_path / "store", "--listen", addr, "--tokens", str(tokens)).start()
    try:
        waiter = await tinystore.connect(addr, token="c" * 24, reconnect_timeout=30)
        try:
            assert await in_line(waiter, "0s") == "held"
            server.stop()  # (no await meanwhile: the SDK has not read the end of its connection)
            started = time.monotonic()
            got = await asyncio.wait_for(in_line(waiter, "2s"), 40)
            assert got == "UnavailableError" and time.monotonic() - started < 10, (got, time.monotonic() - started)
        finally:
            await asyncio.wait_for(waiter.close(), 10)
    finally:
        server.stop()
