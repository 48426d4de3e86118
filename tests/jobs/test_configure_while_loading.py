"""A queue's options changed (``configure``) while the store is still loading the queue, as it does for every queue
right after it starts: the store runs the queue with the new options at once (trial Z: the load had read the old
ones before the write, and the queue ran with them until the next start, while the store kept the new ones)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tinystore.client.jobs import configure
from tinystore.engines.sql import SqlDatabase
from tinystore.protocol.jobs import Options

from ..helpers import open_store
from .util import START, wait_until


def _stored_attempts(directory: Path) -> int:
    with sqlite3.connect(directory / "sql" / "tinystore-jobs.db") as conn:
        (options,) = conn.execute("select options from _tinystore_queues where name = 'mail'").fetchone()
    attempts: int = json.loads(options)["attempts"]
    return attempts


# contract: JOB-03
@pytest.mark.parametrize("where", ["jobs database", "application database"])
async def test_options_configured_during_the_load_at_start_apply_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    directory = tmp_path / "s"
    async with open_store("embedded", directory, clock=START) as store:
        db = await store.database("app") if where == "application database" else None
        q = store.queue("mail", attempts=2, backoff=("1s", "1s"), database=db)
        await q.add({"warm": True})

    # the next start's load of the queue waits after reading the options, until the configure below has written
    gate = asyncio.Event()
    read = SqlDatabase.read

    async def held(self: SqlDatabase, sql: str, *args: Any, **kw: Any) -> Any:
        if "state in ('queued', 'failed', 'running') order by id" in sql and not gate.is_set():
            await gate.wait()
        return await read(self, sql, *args, **kw)

    monkeypatch.setattr(SqlDatabase, "read", held)
    async with open_store("embedded", directory, clock=START) as store:
        configuring = asyncio.ensure_future(configure(store, "mail", Options(attempts=6)))
        await wait_until(lambda: _stored_attempts(directory) == 6, what="configure wrote")
        gate.set()
        info = await asyncio.wait_for(configuring, 10)
        assert info.options.attempts == 6
        db = await store.database("app") if where == "application database" else None
        q = store.queue("mail", attempts=6, backoff=("1s", "1s"), database=db)
        assert (await q.options())["attempts"] == 6
        jid = await q.add({"fail": True})

        async def hopeless(value: Any, run: Any) -> None:
            if value.get("fail"):
                raise RuntimeError("still failing")

        for _ in range(10):
            await q.run_due(hopeless)
            store.clock.advance("2s")
        job = await q.get(jid)
        assert job is not None and (job.state, job.attempts) == ("dead", 6)


# contract: JOB-03
async def test_two_configures_at_once_both_apply(tmp_path: Path) -> None:
    """Each configure changes only the options it names (trial AB: two at once each wrote the whole set read before
    the other's write, and one change was lost)."""
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("mail", attempts=3, lease="30s")
        await q.add({"x": 1})
        await asyncio.gather(
            configure(store, "mail", Options(attempts=7)), configure(store, "mail", Options(lease_ms=10_000))
        )
        options = await store.queue("mail").options()
        assert (options["attempts"], options["lease"]) == (7, 10.0), options
