"""A failed attempt keeps where its handler raised from: ``job.errors[i].traceback`` (the traceback as Python prints
it, its last 4,000 characters), shown by ``tinystore jobs DIR show ID``; ``None`` for an attempt that did not
raise. (It was only in the worker's log, which a job queue's user rarely has at hand when a job is dead.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tinystore
from tinystore.cli import main
from tinystore.protocol.jobs import Report

from ..helpers import open_store
from .util import claim, wait_state


@pytest.fixture(params=["embedded", "private", "tcp"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


def _parse_invoice(text: str) -> int:
    return int(text)  # raises ValueError here, two frames below the handler


# contract: JOB-04
async def test_a_failed_attempt_keeps_its_traceback(store: tinystore.Store) -> None:
    q = store.queue("invoices", attempts=2, backoff=("10ms", "10ms"), timeout="200ms")
    runs = 0

    async def handler(value: dict[str, str], run: tinystore.Run) -> Any:
        nonlocal runs
        runs += 1
        if runs == 1:
            return _parse_invoice(value["total"])
        await asyncio.sleep(5)  # the second attempt times out: it raised nothing

    jid = await q.add({"total": "12,50"})
    worker = q.work(handler)
    try:
        job = await wait_state(q, jid, "dead")
    finally:
        await worker.stop()
    first, second = job.errors
    assert first.error == "ValueError: invalid literal for int() with base 10: '12,50'"
    assert first.traceback is not None
    assert first.traceback.startswith("Traceback (most recent call last):")
    frames = [line.split(", in ")[-1] for line in first.traceback.splitlines() if line.startswith("  File ")]
    assert frames == ["handler", "_parse_invoice"]  # from the handler on: the worker's own frames left out
    assert first.traceback.rstrip().endswith("ValueError: invalid literal for int() with base 10: '12,50'")
    assert second.error.startswith("timed out after") and second.traceback is None
    assert job.error == second.error


# contract: JOB-04
async def test_a_deep_traceback_keeps_its_end(store: tinystore.Store) -> None:
    q = store.queue("deep", attempts=1)

    def down(n: int) -> None:  # (two functions in turn: Python would print one repeated line once)
        if n == 0:
            raise RuntimeError("at the bottom")
        further(n - 1)

    def further(n: int) -> None:
        down(n)

    async def handler(value: Any, run: tinystore.Run) -> None:
        down(100)

    jid = await q.add(1)
    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert job is not None and job.state == "dead"
    (err,) = job.errors
    assert err.traceback is not None and len(err.traceback) == 4000
    assert err.traceback.startswith("Traceback (most recent call last):") and "\n…\n" in err.traceback
    assert "in handler" in err.traceback.split("\n…\n")[0]  # its start: where the handler called
    assert err.traceback.rstrip().endswith("RuntimeError: at the bottom")


# contract: JOB-04
async def test_a_huge_message_leaves_the_frames_in_the_traceback(store: tinystore.Store) -> None:
    # the last 4,000 characters were all message: no frame, not even the error's type (trial CB)
    q = store.queue("huge", attempts=1)
    jid = await q.add(1)

    async def handler(value: Any, run: tinystore.Run) -> None:
        raise ValueError("x" * 100_000)

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert job is not None
    (err,) = job.errors
    assert err.traceback is not None and len(err.traceback) == 4000
    head = err.traceback.split("\n…\n")[0]
    assert "in handler" in head and 'raise ValueError("x" * 100_000)' in head and "ValueError: xxx" in head


# contract: JOB-04
async def test_the_server_cuts_a_traceback_it_is_sent(store: tinystore.Store) -> None:
    # a client of another make may send any traceback: what is kept is bounded all the same
    q = store.queue("raw", attempts=1)
    jid = await q.add("x")
    (c,) = await claim(store, "raw")
    big = "line\n" * 100_000 + "Boom: the end"
    report = Report(queue="raw", id=c.id, fence=c.fence, outcome="error", error="Boom", traceback=big)
    assert await store._call("jobs.report", report, bool, write=True)
    job = await q.get(jid)
    assert job is not None and job.state == "dead"
    (err,) = job.errors
    assert err.traceback is not None and len(err.traceback) == 4000
    assert err.traceback.startswith("…") and err.traceback.endswith("line\nBoom: the end")


def _dead_job(directory: Path, exc: Exception) -> str:
    """The id of a job of an embedded store in ``directory`` whose one attempt raised ``exc``."""

    async def make() -> str:
        async with open_store("embedded", directory) as store:
            q = store.queue("mail", attempts=1)
            jid = await q.add({"to": "a@x"})

            async def handler(value: Any, run: tinystore.Run) -> None:
                raise exc

            await q.run_due(handler)
            return jid

    return asyncio.run(make())


def test_the_command_line_shows_the_last_traceback(tmp_path: Path) -> None:
    d = tmp_path / "store"
    jid = _dead_job(d, ConnectionError("smtp refused"))
    r = CliRunner().invoke(main, ["jobs", str(d), "show", jid], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "traceback of attempt 1:" in r.output
    assert "in handler" in r.output and r.output.rstrip().endswith("ConnectionError: smtp refused")
    r = CliRunner().invoke(main, ["jobs", str(d), "show", jid, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (err,) = json.loads(r.output)["errors"]
    assert err["error"] == "ConnectionError: smtp refused" and "in handler" in err["traceback"]


# contract: JOB-04
async def test_a_traceback_with_a_lone_surrogate_is_kept_escaped(store: tinystore.Store) -> None:
    q = store.queue("names", attempts=1)
    jid = await q.add("x")

    async def handler(value: Any, run: tinystore.Run) -> None:
        raise RuntimeError("caf\udce9")  # (a file name decoded with surrogateescape, say)

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert job is not None
    (err,) = job.errors
    assert err.traceback is not None and err.traceback.rstrip().endswith("RuntimeError: caf\\udce9")


def test_the_command_line_escapes_control_characters_of_a_traceback(tmp_path: Path) -> None:
    # an error's text comes from anywhere (an API's answer): printed raw, it could clear the screen, set the
    # terminal's title or overwrite lines (trial CB)
    d = tmp_path / "store"
    jid = _dead_job(d, ValueError("api said: \x1b[2J\x1b]0;pwned\x07 \r overwritten"))
    r = CliRunner().invoke(main, ["jobs", str(d), "show", jid], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    tail = r.output.split("traceback of attempt 1:")[1]
    assert "\x1b" not in tail and "\x07" not in tail and "\r" not in tail
    assert "\\x1b]0;pwned\\x07" in tail and "\\r overwritten" in tail
