"""A grant heard late (a network that held the answer or the push back) does not make the SDK's own end of the
lease later than the store's: the SDK counts the lease from its ask's sending plus the time the ask waited in line
at the store, not from the moment the grant came. From trial BN: an immediate grant held back 1.2 s, then a cut
network; the store let the 2 s lease run out and gave the key to another while the first block ran for another
second (its SDK counted 0.9 x ttl from the grant's arrival)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore.protocol.locks import ACQUIRE_MANY, RENEW, SETTLED

from ..helpers import open_store
from .support import other_client

TTL = 3.0
LATE = 1.2


def _late_and_unrenewable(store: tinystore.Store, case: str) -> None:
    """The grant comes ``LATE`` seconds after the store gave it; no renewal is ever answered (a cut network)."""
    transport: Any = store.transport
    real_call = transport.call

    async def call(method: str, request: Any, *args: Any, **kw: Any) -> Any:
        if method == RENEW:
            await asyncio.Event().wait()
        got = await real_call(method, request, *args, **kw)
        if method == ACQUIRE_MANY and case == "immediate":
            await asyncio.sleep(LATE)
        return got

    transport.call = call
    handler, body_type = transport.push_handlers[SETTLED]
    loop = asyncio.get_running_loop()
    transport.push_handlers[SETTLED] = (lambda body: loop.call_later(LATE, handler, body), body_type)


# contract: LOCK-05
# contract: LOCK-01
@pytest.mark.parametrize("case", ["immediate", "after_waiting"])
async def test_a_grant_heard_late_ends_before_the_store_gives_the_key_away(tmp_path: Path, case: str) -> None:
    async with open_store("private", tmp_path / "s") as store, other_client(store) as other:
        release = asyncio.Event()
        holding = asyncio.Event()

        async def hold_first() -> None:
            async with other.lock("l", ttl="30s").hold("k"):
                holding.set()
                await release.wait()

        first = None
        if case == "after_waiting":
            first = asyncio.ensure_future(hold_first())
            await holding.wait()
        async with store.lock("warm").try_hold("w"):
            pass  # (the SDK's locks hub, and its push handlers, are made at the first use)
        _late_and_unrenewable(store, case)
        lost_at: list[float] = []

        async def ours() -> None:
            with pytest.raises(tinystore.LostError):
                async with store.lock("l", ttl=f"{TTL:g}s").hold("k", wait="10s"):
                    await asyncio.sleep(10)
            lost_at.append(time.monotonic())

        given_at = time.monotonic()
        task = asyncio.ensure_future(ours())
        if first is not None:
            await asyncio.sleep(0.5)  # ours waits in line
            given_at = time.monotonic()
            release.set()  # the store gives ours the key now; ours hears it LATE seconds later
            await first
        await asyncio.wait_for(task, 10)
        # the store's lease ran out TTL after it gave the key (no renewal reached it): ours ended before that
        assert lost_at[0] - given_at < TTL, lost_at[0] - given_at


# contract: LOCK-05
async def test_an_ask_sent_late_counts_its_lease_from_its_sending(tmp_path: Path) -> None:
    # from trial BP: an ask that waited before it was written (for a reconnect, for credit) counted its lease
    # from the call: granted at once once sent, it was lost at once ("no renewal succeeded for 4.06s of its 3s ttl")
    async with open_store("private", tmp_path / "s") as store:
        async with store.lock("warm").try_hold("w"):
            pass
        transport: Any = store.transport
        real_call = transport.call

        async def call(method: str, request: Any, *args: Any, **kw: Any) -> Any:
            if method == ACQUIRE_MANY:
                await asyncio.sleep(1.5)  # as a reconnect would hold it: not yet written
            return await real_call(method, request, *args, **kw)

        transport.call = call
        async with store.lock("l", ttl="1s").hold("k", wait="10s") as lease:
            await asyncio.sleep(1.2)  # past the ttl: the SDK renews it
            assert not lease.lost.is_set()
