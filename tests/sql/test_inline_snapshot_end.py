"""The read transaction that the inline reads of one loop turn share ends at the next turn even when the loop
was slow: the progress handler that bounds an inline read never stops the engine's own COMMIT of it (it did, once
the last read's budget was over: an ERROR in the log, and a snapshot that could stay open, holding the WAL)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from ..helpers import open_store


async def test_a_slow_turn_does_not_stop_the_commit_of_its_shared_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        await store.database("app", migrations=[("001", "create table t (id integer primary key)")])
        sqldb = store._core.sql.get("app")  # type: ignore[attr-defined]
        conn = sqldb._inline
        assert conn is not None, "this test needs inline reads"
        conn.set_progress_handler(sqldb._inline_check, 1)  # checked at every SQLite instruction
        caplog.set_level(logging.WARNING)
        for _ in range(20):
            sqldb.read_now("select count(*) from t", [], "scalar")
            sqldb.read_now("select count(*) from t", [], "scalar")  # the second read of the turn: a snapshot
            assert conn.in_transaction
            sqldb._inline_deadline = time.monotonic() - 1  # the turn ran past the last read's budget
            sqldb._end_turn()
            assert not conn.in_transaction, "the shared read transaction stayed open"
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
