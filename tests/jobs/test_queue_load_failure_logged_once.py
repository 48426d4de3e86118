"""From trial HP: a queue whose database file was gone logged "queue ... could not be loaded" again at every call of
a client that polled it (a web process's log filled with one line a request). Logged once for each reason; the
calls raise it each time."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store


# contract: JOB-06
async def test_a_queue_that_cannot_load_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        q = store.queue("mq", dict, database=db)
        jid = await q.add({"a": 1})
    aside = tmp_path / "aside"
    aside.mkdir()
    for f in (tmp_path / "s" / "sql").glob("app.db*"):
        f.rename(aside / f.name)
    caplog.set_level(logging.ERROR, logger="tinystore.jobs")
    # (the command line's own filter of this message, added by a CLI test run in this process before: not here)
    monkeypatch.setattr(logging.getLogger("tinystore.jobs"), "filters", [])
    async with open_store("embedded", tmp_path / "s") as store:
        q = store.queue("mq", dict, database="app")
        for _ in range(4):
            with pytest.raises(tinystore.UnavailableError):
                await q.get(jid)
        logged = [r for r in caplog.records if "could not be loaded" in r.getMessage()]
        assert len(logged) == 1, [r.getMessage() for r in logged]
        other = store.queue("other", dict)
        assert await other.add({"b": 2})  # (the rest of the store goes on)
