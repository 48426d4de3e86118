"""``store.clock.advance("1h")`` as API.md writes it, not awaited: over a socket (``private=True``) every call made
after it reaches the server after the move, as embedded, where the move is made before ``advance`` returns."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ..helpers import open_store

START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_call_after_an_advance_not_awaited_sees_the_move(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "store", clock=START) as store:
        for hours in range(1, 6):
            store.clock.advance("1h")
            assert await store.clock.now() == pytest.approx(START.timestamp() + hours * 3600, abs=60)
        for _ in range(3):  # from trial AP: of several, only the last was waited for
            store.clock.advance("1h")
        assert await store.clock.now() == pytest.approx(START.timestamp() + 8 * 3600, abs=60)


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_cancelled_advance_is_made_all_the_same(tmp_path: Path, mode: str) -> None:
    """The docstring: "A cancel of the future leaves the move to happen". Trial EN: over a socket, a cancelled
    advance, or one awaited under ``asyncio.timeout(0)``, was never made (while this process counted it)."""
    async with open_store(mode, tmp_path / "store", clock=START) as store:
        store.clock.advance("1h").cancel()
        assert await store.clock.now() == pytest.approx(START.timestamp() + 3600, abs=60)
        for _ in range(5):
            with contextlib.suppress(TimeoutError):  # (embedded: made already, nothing to wait for)
                async with asyncio.timeout(0):
                    await store.clock.advance("1h")
        assert await store.clock.now() == pytest.approx(START.timestamp() + 6 * 3600, abs=60)


# contract: LOCK-06
@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_lease_past_max_hold_after_an_advance_not_awaited_is_over(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "store", clock=START) as store:
        reports = store.lock("reports", ttl="1h", max_hold="10s")
        held = asyncio.Event()

        async def holder() -> None:
            async with reports.hold("q3"):
                held.set()
                await asyncio.sleep(30)

        task = asyncio.ensure_future(holder())
        await held.wait()
        store.clock.advance("11s")  # past max_hold: the lease is over before the next call is read
        async with reports.try_hold("q3") as lease:
            assert lease is not None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
