"""From trial AS: each private store's open and close left its server's two pipes open in the caller until a
garbage collection (a program with the collector off leaked them for good)."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

import tinystore


# contract: STORE-05
async def test_a_private_stores_close_leaves_no_descriptor_behind(tmp_path: Path) -> None:
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    gc.collect()
    gc.disable()
    try:
        store = await tinystore.open(tmp_path / "s", private=True)  # (the first: threads, the loop's own pipes)
        await store.close()
        before = fds()
        for _ in range(10):
            store = await tinystore.open(tmp_path / "s", private=True)
            await store.close()
        for _ in range(100):  # (a closing pipe's thread may take a moment)
            if fds() <= before + 2:
                break
            await asyncio.sleep(0.02)
        assert fds() <= before + 2, (before, fds())
    finally:
        gc.enable()
