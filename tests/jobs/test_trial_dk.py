"""From trial DK: calls of the jobs API whose item counts were read whole before any bound (the siblings of
jobs.renew's), and the SDK's parts under those bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from tinystore import InvalidError, LimitError
from tinystore.client import jobs as client_jobs
from tinystore.protocol.jobs import ADD_MAX, RELEASE_MAX, Add, Attempt, Claim, Claimed, NewJob, Release
from tinystore.protocol.sql import Exec, Query

from ..helpers import open_store


async def test_a_release_or_an_add_past_its_item_limit_is_refused_as_read(tmp_path: Path) -> None:
    """5 million attempts in one jobs.release kept the server's loop 0.4 s (a reply of 0); 1.8 million jobs of one
    jobs.add were decoded, 0.3 s, before their count was refused. Both are refused as the body is read now, the
    connection going on."""
    async with open_store("private", tmp_path / "s") as store:
        queue = store.queue("q")
        await queue.add(1)
        with pytest.raises(InvalidError, match=r"jobs.release: Expected `array` of length <= 10000"):
            await store._call("jobs.release", Release(queue="q", attempts=[Attempt("x", 1)] * (RELEASE_MAX + 1)), Any)
        value = msgspec.json.encode(1).decode()
        with pytest.raises(InvalidError, match=r"jobs.add: Expected `array` of length <= 100000"):
            await store._call("jobs.add", Add(queue="q", jobs=[NewJob(value=value)] * (ADD_MAX + 1)), Any)
        assert len((await queue.list()).jobs) == 1  # the connection goes on, nothing added


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_add_many_past_the_limit_is_a_limit_error_naming_the_queue(tmp_path: Path, mode: str) -> None:
    """Over a connection, the store's refusal read as a decoding error; the SDK tells it as the engine does."""
    async with open_store(mode, tmp_path / "s") as store:
        queue = store.queue("q")
        with pytest.raises(LimitError, match=r"queue q: 100,001 jobs in one add; at most 100,000"):
            await queue.add_many([1] * (ADD_MAX + 1))
        assert (await queue.list()).jobs == []


async def test_too_many_sql_parameters_name_the_database(tmp_path: Path) -> None:
    """Over a connection, 250,001 parameters were refused as `sql.query: Expected array of length <= 250000 -
    at $[2]`, naming neither the database nor the parameters."""
    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app")
        n = 250_001
        with pytest.raises(InvalidError, match=r"database app: too many SQL variables \(250,001 parameters"):
            await db.all("select 1 where ? in (" + ",".join("?" * (n - 1)) + ")", *range(n))
        assert await db.scalar("select 1") == 1


@pytest.mark.parametrize("method", ["sql.exec", "sql.query"])
async def test_too_many_sql_parameters_sent_past_the_sdk_name_the_database(tmp_path: Path, method: str) -> None:
    """From trial DS: a call that skips the SDK's own check (another client of the protocol) was refused with
    msgspec's "Expected `array` of length <= 250000 - at `$[2]`"; the connection goes on."""
    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app")
        request = (Exec if method == "sql.exec" else Query)("app", "select ?", [1] * 250_001)
        with pytest.raises(InvalidError, match=r"database app: too many SQL variables \(250,001 parameters; at most"):
            await store.transport.call(method, request, Any)
        assert await db.scalar("select 1") == 1


async def test_a_hand_back_past_the_limit_goes_in_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempts handed back (claimed, not run) go to the store in parts of at most RELEASE_MAX: all of them
    queued again, uncounted."""
    monkeypatch.setattr(client_jobs, "RELEASE_MAX", 2)
    async with open_store("private", tmp_path / "s") as store:
        queue = store.queue("q")
        ids = await queue.add_many([1, 2, 3, 4, 5])
        claimed = await store._call("jobs.claim", Claim(queue="q", n=5), list[Claimed])
        assert sorted(c.id for c in claimed) == sorted(ids)

        async def handler(value: Any, run: Any) -> None:
            pass

        runner = client_jobs._Runner(queue, handler, "w")
        await runner.hand_back(claimed, 5.0)
        jobs = [await queue.get(i) for i in ids]
        assert [(j.state, j.attempts) for j in jobs if j is not None] == [("queued", 0)] * 5


@pytest.mark.parametrize("case", ["deep", "long name"])
async def test_a_body_over_the_parameters_that_cannot_be_read_is_refused_plainly(tmp_path: Path, case: str) -> None:
    """From trial DU: over 250,000 parameters, the first nested too deep to be read: the look at the body for its
    database raised RecursionError, answered as an internal error (a traceback in the server's log); and a name of
    a million characters was repeated in the message."""
    enc = msgspec.msgpack.encode
    params = b"\xdd" + (250_001).to_bytes(4, "big")
    if case == "deep":
        body = b"\x93" + enc("app") + enc("select ?") + params + b"\x91" * 200_000 + b"\x01" * 250_001
    else:
        body = b"\x93" + enc("a" * 1_000_000) + enc("select ?") + params + b"\x01" * 250_001
    async with open_store("private", tmp_path / "s") as store:
        db = await store.database("app")
        with pytest.raises(InvalidError) as e:
            await store.transport.call("sql.query", msgspec.Raw(body), Any)
        assert "internal" not in e.value.message and len(e.value.message) < 500, e.value.message
        assert await db.scalar("select 1") == 1
