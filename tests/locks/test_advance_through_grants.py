"""Trial ET: a lease granted by a timer of a test clock's ``advance`` (the holder before it ran out) ran its ttl from
the advance's end, not from when the key was passed on: one advance of 2 h 2 min left the second holder a lease
until 3 h 2 min, where two advances of 61 min each ended it at 2 h. Each timer of an advance now runs with the clock
at its own time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

import tinystore
from tinystore import LostError

from ..helpers import open_store

START = datetime(2030, 1, 1, tzinfo=UTC)
HOUR = 3600.0


# contract: LOCK-05
@pytest.mark.parametrize("advances", [[7320.0], [3660.0, 3660.0], [5000.0]])
async def test_a_lease_granted_within_an_advance_runs_its_ttl_from_its_grant(
    tmp_path: Path, advances: list[float]
) -> None:
    # (over a connection: an embedded store's own leases last as long as its process, whatever their ttl)
    async with open_store("private", tmp_path / "store", clock=START) as store:
        lock = store.lock("l", ttl="1h")
        t0 = await store.clock.now()
        granted: dict[str, tinystore.Lease] = {}
        lost: list[str] = []

        async def holder(name: str) -> None:
            try:
                async with lock.hold("a", wait="1000d") as lease:
                    granted[name] = lease
                    await asyncio.sleep(3600)
            except LostError:
                lost.append(name)

        first = asyncio.ensure_future(holder("first"))
        while "first" not in granted:
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(holder("second"))
        while (await store.status())["locks"]["waiters"] != 1:
            await asyncio.sleep(0.01)
        for step in advances:
            await store.clock.advance(step)
        total = sum(advances)
        try:
            async with asyncio.timeout(10):
                if total >= 2 * HOUR:
                    # the second's lease began at the first's end (1 h) and ended at 2 h, within the advances
                    await asyncio.gather(first, second)
                    assert sorted(lost) == ["first", "second"], lost
                    async with lock.try_hold("a") as third:
                        assert third is not None
                else:
                    await first
                    while "second" not in granted:
                        await asyncio.sleep(0.01)
                    expires = granted["second"].expires_at.timestamp() - t0
                    assert 2 * HOUR - 5 <= expires <= 2 * HOUR + 5, expires  # (real time moves the clock too)
        finally:
            for task in (first, second):
                task.cancel()
            await asyncio.gather(first, second, return_exceptions=True)
