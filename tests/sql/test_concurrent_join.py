"""A database's threads waited for by two threads at once (a cancelled stop's own wait, still running in the
default executor, and the thread that lets the directory go once they have ended): the second returned while the
first still closed a connection, and the directory was let go with the file still open (CI, 2026-12-07)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import tinystore


class SlowClose:
    """Stands for a connection whose close takes a while (SQLite closing the file; a statement finalized late)."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = threading.Event()

    def close(self) -> None:
        self.calls += 1
        if self.calls == 1:
            time.sleep(0.3)
            self.closed.set()
        # (a second close of a closed connection returns at once, as sqlite3's does)


# contract: STORE-01
async def test_a_join_returns_only_once_the_connections_it_closes_are_closed(tmp_path: Path) -> None:
    store = await tinystore.open(tmp_path / "store", embedded=True)
    try:
        await store.database("app", migrations=[("001.sql", "create table t (x);")])
        assert store._core is not None
        db = store._core.sql.databases["app"]
        real: Any = db._inline
        slow = SlowClose()
        db._inline = slow  # type: ignore[assignment]
        db.close()
        outcomes: list[bool] = []

        def join() -> None:
            db.join(30)
            outcomes.append(slow.closed.is_set())

        first = threading.Thread(target=join)
        first.start()
        while slow.calls == 0 and first.is_alive():
            await asyncio.sleep(0.001)
        second = threading.Thread(target=join)
        second.start()
        await asyncio.to_thread(first.join)
        await asyncio.to_thread(second.join)
        assert outcomes == [True, True]
        if real is not None:
            real.close()
    finally:
        await store.close()
