"""Trial IA: a worker whose store was replaced by another (a backup restored in its place) tried its attempt's
report again every 5 s, a warning each time, though the store would never be reached again: it gives up at once
now, and says why."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import tinystore


# contract: JOB-03
async def test_a_report_to_a_store_replaced_by_another_is_not_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tinystore")
    directory = tmp_path / "store"
    first = await tinystore.open(directory, embedded=True)
    client = await tinystore.open(directory, reconnect_timeout="20s")  # (over the embedded store's socket)
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(value: Any, run: tinystore.Run) -> None:
        started.set()
        await release.wait()

    try:
        q = client.queue("q")
        await q.add({"n": 1})
        worker = q.work(handler)
        await asyncio.wait_for(started.wait(), 10)
        await first.close()
        (directory / "ID").write_text("0123456789abcdef0123456789abcdef\n")  # another store at the path, as it were
        second = await tinystore.open(directory, embedded=True)
        try:
            release.set()
            with pytest.raises(tinystore.UnavailableError, match="is another store now"):
                await asyncio.wait_for(worker.wait(), 15)
        finally:
            await second.close()
    finally:
        await client.close()
    retries = [r for r in caplog.records if "report failed" in r.getMessage()]
    assert retries == [], [r.getMessage() for r in retries]
    ends = [r.getMessage() for r in caplog.records if "could not be reported" in r.getMessage()]
    assert len(ends) == 1 and "will not be reached again" in ends[0], ends
