"""A connection that drops in the loop turn the store grants it a lease: the grant (the answer, or the push that
settles a waiting ask) is lost with it. The SDK asks again from its next connection; the lease nobody heard of
must not stay held by nobody until its ttl, with the client waiting behind its own lease."""

from __future__ import annotations

import asyncio
import contextvars
from pathlib import Path

import tinystore

from ..helpers import open_store


async def _drop_as_granted(main: tinystore.Store, other: tinystore.Store, key: str) -> list[str]:
    """``main`` holds ``key``, ``other`` waits for it; the key passes to ``other`` in the loop turn its connection
    drops. Returns how ``other``'s hold ended."""
    holder_in, let_go = asyncio.Event(), asyncio.Event()
    outcome: list[str] = []

    async def holder() -> None:
        async with main.lock("l", ttl="60s").hold(key, wait=0):
            holder_in.set()
            await let_go.wait()

    async def waiter() -> None:
        try:
            async with other.lock("l", ttl="60s").hold(key, wait="5s"):
                outcome.append("granted")
        except tinystore.TinystoreError as exc:
            outcome.append(repr(exc))

    h = asyncio.create_task(holder(), context=contextvars.Context())
    await holder_in.wait()
    w = asyncio.create_task(waiter(), context=contextvars.Context())
    await asyncio.sleep(0.05)  # the waiter is in line
    let_go.set()  # the key goes to the waiter ...
    other.transport.abort()  # type: ignore[attr-defined]  # ... as its connection drops
    await asyncio.gather(h, w)
    return outcome


# contract: LOCK-07
async def test_a_lease_granted_as_its_connection_drops_is_let_go_and_the_key_passes_on(tmp_path: Path) -> None:
    async with open_store("private", tmp_path / "d") as main:
        other = await tinystore.open(tmp_path / "d")  # a second connection, to the same server
        try:
            orphans = []
            for i in range(12):
                key = f"k{i}"
                outcome = await _drop_as_granted(main, other, key)
                assert outcome == ["granted"], (i, outcome)
                for _ in range(50):  # (the orphan, if any, is let go by the reconnected client's next call)
                    keys = [k for k in (await main.status())["locks"]["keys"] if k["key"] == key]
                    if not keys:
                        break
                    await asyncio.sleep(0.02)
                else:
                    orphans.append((key, keys))
            assert not orphans, orphans
            async with other.lock("l", ttl="60s").try_hold("k0") as lease:
                assert lease is not None  # nobody holds it
        finally:
            await other.close()


# contract: LOCK-07
async def test_a_try_hold_whose_answer_a_drop_lost_gets_the_free_key(tmp_path: Path) -> None:
    """try_hold on a key nobody holds, the connection dropping after the request went out: the store granted it
    and the answer was lost; asked again from the next connection, the SDK met its own lost lease (None)."""
    async with open_store("private", tmp_path / "d") as main:
        other = await tinystore.open(tmp_path / "d")
        try:
            for i in range(15):
                key = f"free-{i}"
                got: list[object] = []

                async def take(key: str = key, got: list[object] = got) -> None:
                    async with other.lock("l", ttl="60s").try_hold(key) as lease:
                        got.append(lease)

                t = asyncio.create_task(take(), context=contextvars.Context())
                for _ in range(i % 5 + 1):
                    await asyncio.sleep(0)  # the request goes out ...
                other.transport.abort()  # type: ignore[attr-defined]  # ... and the connection drops
                await t
                assert got and got[0] is not None, (i, got)
                for _ in range(50):
                    if not [k for k in (await main.status())["locks"]["keys"] if k["key"] == key]:
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise AssertionError(f"{key} is still held after its block ended")
        finally:
            await other.close()
