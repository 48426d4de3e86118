"""A server that starts where the last owner of its directory did not stop cleanly says so in its log (trial IT: an
operator restarting a store after a ``kill -9`` or an out-of-memory kill found nothing about it there)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import tinystore

from ..helpers import ServerProcess

NOTE = "did not stop cleanly"


def test_a_server_started_after_a_kill_says_the_last_one_did_not_stop_cleanly(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    first = ServerProcess(directory).start()
    assert first.proc is not None
    killed = first.proc.pid
    first.kill()
    second = ServerProcess(directory).start()
    try:
        assert second.stop() == 0  # (a clean stop: the next start has nothing to say)
    finally:
        second.stop()
    third = ServerProcess(directory).start()
    third.stop()
    log = (directory / "serve.log").read_text()
    notes = [line for line in log.splitlines() if NOTE in line]
    assert len(notes) == 1, log
    assert f"pid {killed}, serve, started " in notes[0]
    assert "WARNING" in notes[0]


async def test_an_embedded_store_whose_program_ended_without_close_is_named_at_the_next_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "store"
    program = (
        "import asyncio, os, sys, tinystore\n"
        "async def main():\n"
        "    store = await tinystore.open(sys.argv[1], embedded=True)\n"
        "    await store.database('app', migrations=[('001.sql', 'create table t (x);')])\n"
        "    os._exit(0)\n"
        "asyncio.run(main())\n"
    )
    await asyncio.to_thread(subprocess.run, [sys.executable, "-c", program, str(directory)], check=True, timeout=60)
    with caplog.at_level(logging.WARNING, logger="tinystore.server"):
        store = await tinystore.open(directory, embedded=True)
        await store.close()
        store = await tinystore.open(directory, embedded=True)
        await store.close()
    notes = [r.getMessage() for r in caplog.records if NOTE in r.getMessage()]
    assert len(notes) == 1, notes
    assert "embedded" in notes[0] and "without close()" in notes[0]


async def test_what_an_odd_address_file_says_is_written_on_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Trial IY: an address file's pid of text with a line break in it wrote a log line of its own."""
    import json

    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True)
    address = json.loads((directory / "server" / "address").read_text())
    await store.close()
    address.update(pid="1\n[fake] INFO all good", mode=["x"])
    (directory / "server" / "address").write_text(json.dumps(address))
    with caplog.at_level(logging.WARNING, logger="tinystore.server"):
        store = await tinystore.open(directory, embedded=True)
        await store.close()
    notes = [r.getMessage() for r in caplog.records if NOTE in r.getMessage()]
    assert len(notes) == 1 and "\n" not in notes[0], notes
    assert "'1\\n[fake] INFO all good'" in notes[0], notes
