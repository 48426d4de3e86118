"""Trial EJ: a server short of memory could not start a database's reader thread: the client got "internal error:
RuntimeError: can't start new thread", and the threads already started (the writer's, with its connection) ran on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import tinystore


async def test_a_database_whose_threads_cannot_start_is_unavailable_and_leaves_none_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "tinystore-sql-app-r1":
            raise RuntimeError("can't start new thread")
        real(self)

    store = await tinystore.open(tmp_path / "store", embedded=True)
    try:
        monkeypatch.setattr(threading.Thread, "start", start)
        with pytest.raises(tinystore.UnavailableError, match="database app: the server could not start its threads"):
            await store.database("app", migrations=[("001.sql", "create table t (x);")])
        monkeypatch.undo()
        async with asyncio.timeout(10):
            while any(t.name.startswith("tinystore-sql-app-") for t in threading.enumerate()):
                await asyncio.sleep(0.01)
        db = await store.database("app", migrations=[("001.sql", "create table t (x);")])
        await db.exec("insert into t values (1)")
        assert await db.scalar("select count(*) from t") == 1
        assert sum(t.name.startswith("tinystore-sql-app-w") for t in threading.enumerate()) == 1
    finally:
        await store.close()
