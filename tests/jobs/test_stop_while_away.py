"""A worker stopped while its store is away (a `tinystore serve` that stopped) stops at once: its claims ended
with the connection, so there is nothing to tell the store, and nothing waits out the SDK's reconnect."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import tinystore

from ..helpers import ServerProcess


async def test_a_worker_stopped_while_its_store_is_away_stops_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    server = ServerProcess(directory).start()
    try:
        store = await tinystore.open(directory)
        try:
            q = store.queue("q", dict)

            async def handler(value: Any, run: Any) -> None:
                pass

            worker = q.work(handler, concurrency=2)
            await q.add({"n": 1})
            await asyncio.sleep(0.3)  # the worker waits in a claim
            server.stop()
            await asyncio.sleep(0.5)  # the SDK saw the connection drop: it waits for the store to come back
            async with asyncio.timeout(8):  # not reconnect_timeout (30 s)
                await worker.stop()
        finally:
            async with asyncio.timeout(8):
                await store.close()
    finally:
        server.stop()
