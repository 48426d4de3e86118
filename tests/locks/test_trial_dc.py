"""Trial DC: waiters in line on one connection that dropped asked again out of order, the first one last."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tinystore
from tests.helpers import drop_connection, open_store


# contract: LOCK-03
async def test_waiters_keep_their_order_when_their_connection_drops(tmp_path: Path) -> None:
    async with open_store("sidecar", tmp_path / "s") as holder:
        waiters = await tinystore.open(tmp_path / "s")
        try:
            granted: list[int] = []
            lock = waiters.lock("fifo", ttl="5s")
            in_line = asyncio.Event()

            async def waiter(i: int) -> None:
                await asyncio.sleep(0.05 * i)  # 0 asks first, then 1, 2, ...
                if i == 4:
                    in_line.set()
                async with lock.hold("k", wait="20s"):
                    granted.append(i)
                    await asyncio.sleep(0.02)

            async with holder.lock("fifo", ttl="5s").hold("k"):
                tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
                await in_line.wait()
                await asyncio.sleep(0.3)  # all five wait in line at the store
                drop_connection(waiters)
                await asyncio.sleep(1.0)  # they ask again from the next connection
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            assert granted == [0, 1, 2, 3, 4], granted
        finally:
            await waiters.close()
