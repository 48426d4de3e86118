"""``store.status()`` and ``tinystore status DIR --json`` show the memory each engine keeps beyond what it holds
(trial X found the server's memory growing for some 25 minutes before it levelled off: four capped caches
filling up; an operator could not tell that from a leak). Each count is there and moves with what it counts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..helpers import open_store
from ..jobs.util import START, claim, other_client, report


def _status_command(*args: str) -> str:
    """What ``tinystore status ARGS`` prints."""
    return subprocess.run(
        [sys.executable, "-m", "tinystore", "status", *args], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def _queue(status: dict[str, Any], name: str) -> dict[str, Any]:
    [q] = [q for q in status["jobs"]["queues"] if q["queue"] == name]
    return q


# contract: CHAN-08
async def test_status_shows_what_each_engine_keeps(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", clock=START) as store, other_client(store) as remote:
        q = store.queue("kept", lease="30s")
        await q.add({"now": True})
        await q.add({"later": True}, delay="1h")
        status = await store.status()
        assert (_queue(status, "kept")["index"], _queue(status, "kept")["deadlines"]) == (2, 1)
        assert status["jobs"]["claims_kept"] == 0
        [c] = await claim(remote, "kept")
        status = await store.status()
        # the claim's answer is remembered (in case it is lost); the attempt has a lease and an expected time
        assert status["jobs"]["claims_kept"] == 1
        assert _queue(status, "kept")["deadlines"] == 3
        assert await report(remote, "kept", c)
        assert _queue(await store.status(), "kept")["index"] == 1

        lock = remote.lock("kept", ttl="5s")
        held = asyncio.Event()

        async def holder() -> None:
            async with lock.try_hold("k") as lease:
                assert lease is not None
                held.set()
                await asyncio.sleep(3600)

        holding = asyncio.ensure_future(holder())
        await held.wait()
        assert (await store.status())["locks"]["ended_kept"] == 0
        store.clock.advance("1m")  # the remote holder's lease runs out: it is remembered, for its late renewal
        await asyncio.gather(holding, return_exceptions=True)  # (its block is cancelled)
        status = await store.status()
        assert status["locks"]["ended_kept"] == 1
        for key in ("granted_kept", "orphans_kept"):
            assert isinstance(status["locks"][key], int)
        for key in ("tombstones", "unheard_kept"):
            assert isinstance(status["channels"][key], int)


# contract: CHAN-08
def test_the_command_line_shows_them_too(tmp_path: Path) -> None:
    directory = tmp_path / "s"

    async def fill() -> None:
        async with open_store("embedded", directory) as store:
            await store.queue("kept").add({"x": 1})

    asyncio.run(fill())
    out = _status_command(str(directory), "--json")
    status = json.loads(out)
    assert "claims_kept" in status["jobs"] and "ended_kept" in status["locks"]
    assert "tombstones" in status["channels"]
    text = _status_command(str(directory))
    assert "claims_kept 0" in text and "ended_kept 0" in text and "tombstones 0" in text, text


# contract: SQL-02
def test_status_lists_the_databases_not_opened_since_the_start(tmp_path: Path) -> None:
    """A store just started has opened none of its databases: status lists them all the same, with their files'
    sizes (trial AA: a user checking a store after a restart saw no databases and could think the data gone)."""
    directory = tmp_path / "s"

    async def fill() -> None:
        async with open_store("embedded", directory) as store:
            db = await store.database("app", migrations=[("001.sql", "create table t (x)")])
            await db.exec("insert into t values (1)")

    asyncio.run(fill())

    async def look() -> dict[str, Any]:
        async with open_store("embedded", directory) as store:
            return await store.status()

    status = asyncio.run(look())
    app = status["databases"]["app"]
    assert app["open"] is False and app["bytes"] > 0 and app["path"].endswith("app.db")
    text = _status_command(str(directory))
    assert "app" in text and "no (" in text, text
