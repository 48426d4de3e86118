"""From trial DL: under PYTHONUNBUFFERED (``python -u``; many container images set it) a command's output to a
pipe whose reader was slow lost all but its first 64 KiB, with status 0: CPython's text layer over an unbuffered
stdout does not write again after a write the kernel took in part."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from ..helpers import open_store
from .support import popen_cli


@pytest.mark.parametrize("unbuffered", ["1", ""])
async def test_a_slow_reader_gets_all_of_a_large_output(tmp_path: Path, unbuffered: str) -> None:
    directory = tmp_path / "s"
    async with open_store("embedded", directory, serve=False) as store:
        job_id = await store.queue("big").add("x" * 1_000_000)
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    proc = popen_cli("jobs", str(directory), "show", job_id, "--json", stdout=subprocess.PIPE, env=env)
    try:
        await asyncio.sleep(1.5)  # a slow reader: the pipe (64 KiB) fills, the command's write is taken in part
        out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert len(out) > 1_000_000
    assert json.loads(out)["value"] == "x" * 1_000_000


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("unbuffered", ["1", ""])
@pytest.mark.parametrize("command", ["--help", "status", "sql"])
async def test_output_that_cannot_be_written_is_told_in_one_line(tmp_path: Path, unbuffered: str, command: str) -> None:
    """From trial DS: stdout to a full disk (``> /dev/full``) gave a traceback, then Python's "Exception ignored"
    of its last flush, status 120."""
    directory = tmp_path / "s"
    async with open_store("embedded", directory, serve=False) as store:
        await store.database("main")
    args = {"--help": ["--help"], "status": ["status", str(directory)], "sql": ["sql", str(directory), "select 1"]}
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    with open("/dev/full", "w") as full:
        proc = popen_cli(*args[command], stdout=full, stderr=subprocess.PIPE, env=env)
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    text = err.decode()
    assert proc.returncode == 1, text
    assert text == "tinystore: the output could not be written: No space left on device\n", text
